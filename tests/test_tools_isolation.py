"""IsolatedTool survives crashing and hanging tools; fallbacks are recorded and can be refused."""
from __future__ import annotations

import os
import threading

from agenttune_lib.events import EventKind
from agenttune_lib.spine import DictToolHarness, ReActStrategy, run_episode
from agenttune_lib.tools.isolation import IsolatedTool, isolate_tools
from _spine_helpers import Scripted, call, crash, double, hang, whoami


def test_runs_in_a_separate_process():
    result = IsolatedTool(whoami, timeout=60).invoke({})
    assert result.ok and result.metadata["isolation"] == "process"
    assert result.value != os.getpid()
    assert IsolatedTool(double, timeout=60).invoke({"x": 21}).value == 42


def test_survives_a_crashing_tool():
    result = IsolatedTool(crash, timeout=60).invoke({"code": 7})
    assert result.error["type"] == "crash" and "exit code 7" in result.error["message"]
    assert result.metadata["isolation"] == "process"


def test_survives_a_hanging_tool():
    result = IsolatedTool(hang, timeout=1.5).invoke({"seconds": 60})
    assert result.error["type"] == "timeout" and result.metadata["isolation"] == "process"


def test_unpicklable_tool_is_refused_unless_the_caller_allows_in_process():
    lock = threading.Lock()

    def locked_counter() -> int:
        """Holds a lock: cannot cross a process boundary."""
        with lock:
            return os.getpid()

    refused = IsolatedTool(locked_counter, timeout=5).invoke({})  # fail closed by default
    assert refused.error["type"] == "isolation_required" and refused.metadata["isolation"] == "refused"
    fallback = IsolatedTool(locked_counter, timeout=5, allow_fallback=("unpicklable",)).invoke({})
    assert fallback.ok and fallback.value == os.getpid()
    assert fallback.metadata == {"isolation": "in_process", "isolation_failure": "unpicklable"}
    strict = IsolatedTool(locked_counter, timeout=5, allow_fallback=True, require_isolation=True).invoke({})
    assert strict.error["type"] == "isolation_required"


def test_hang_with_fallback_allowed_still_returns():
    lock = threading.Lock()

    def slow_locked(seconds: float) -> str:
        """Unpicklable and slow."""
        import time

        with lock:
            time.sleep(seconds)
        return "done"

    result = IsolatedTool(slow_locked, timeout=0.5, allow_fallback=True).invoke({"seconds": 5})
    assert result.error["type"] == "timeout" and result.metadata["isolation"] == "in_process"


def test_isolated_tools_in_a_harness_episode():
    tools = isolate_tools({"double": double, "crash": crash}, timeout=60)
    assert tools["double"].to_schema()["function"]["parameters"]["required"] == ["x"]
    model = Scripted([call("crash", code=1), call("double", x=4), "8"])
    log = run_episode(ReActStrategy(model), DictToolHarness(tools), {"prompt": "double 4", "answer": "8"})
    results = [e.payload for e in log if e.kind is EventKind.TOOL_RESULT]
    assert results[0]["error"]["type"] == "crash" and results[0]["metadata"]["isolation"] == "process"
    assert results[1]["content"] == "8" and "error" not in results[1]
    assert log.rewards("episode") == [1.0]
    invalid = tools["double"].invoke({"x": "no"})
    assert invalid.error["type"] == "invalid_arguments" and invalid.metadata["isolation"] == "not_run"


def test_a_tool_imported_from_a_directory_others_cannot_enter_runs_isolated(tmp_path, monkeypatch):
    """A checkout under ``mktemp -d`` is mode 0700: the sandbox's unprivileged uid must still read the tool's module."""
    import importlib
    import sys

    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "closed_tool.py").write_text("import os\n\ndef pid_of_tool() -> int:\n    \"\"\"The process id running this tool.\"\"\"\n    return os.getpid()\n")
    os.chmod(closed, 0o700)
    monkeypatch.syspath_prepend(str(closed))
    module = importlib.import_module("closed_tool")
    try:
        result = IsolatedTool(module.pid_of_tool, timeout=60).invoke({})
    finally:
        sys.modules.pop("closed_tool", None)
    assert result.ok, result.content
    assert result.metadata["isolation"] == "process" and result.value != os.getpid()
