"""Workspace-confined file tools; code execution off unless enabled."""
from __future__ import annotations

import pytest

from agenttune_lib.tools.builtins import RunBashTool, RunPythonTool, builtin_tools


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("alpha\nTermination clause: 30 days\n")
    (tmp_path / "b.md").write_text("beta\n")
    (tmp_path.parent / "secret.txt").write_text("outside")
    return tmp_path


def test_file_tools_round_trip(ws):
    tools = builtin_tools(ws)
    assert set(tools) == {"read_file", "write_file", "list_files", "grep"}
    assert tools["write_file"].invoke({"path": "new/c.txt", "content": "gamma"}).ok
    assert tools["read_file"].invoke({"path": "new/c.txt"}).content == "gamma"
    assert tools["list_files"].invoke({"pattern": "*.txt"}).value == ["docs/a.txt", "new/c.txt"]
    assert tools["grep"].invoke({"pattern": "termination", "ignore_case": True}).value == ["docs/a.txt:2: Termination clause: 30 days"]


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd", "docs/../../secret.txt"])
def test_paths_outside_the_workspace_are_refused(ws, path):
    result = builtin_tools(ws)["read_file"].invoke({"path": path})
    assert result.error["type"] == "outside_workspace"


def test_symlink_escape_is_refused(ws):
    (ws / "link").symlink_to(ws.parent)
    assert builtin_tools(ws)["read_file"].invoke({"path": "link/secret.txt"}).error["type"] == "outside_workspace"


def test_missing_file_and_bad_regex_are_structured_errors(ws):
    tools = builtin_tools(ws)
    assert tools["read_file"].invoke({"path": "nope.txt"}).error["type"] == "not_found"
    assert tools["grep"].invoke({"pattern": "("}).error["type"] == "invalid_pattern"


def test_code_tools_off_unless_enabled_and_warn(ws):
    assert "run_python" not in builtin_tools(ws)
    disabled = RunPythonTool(ws).invoke({"code": "print(1)"})
    assert disabled.error["type"] == "disabled"
    assert "full rights" in RunPythonTool.description and "full rights" in RunBashTool.description
    tools = builtin_tools(ws, enable_code_execution=True, timeout=30)
    assert tools["run_python"].invoke({"code": "print(6*7)"}).value["stdout"].strip() == "42"
    assert tools["run_bash"].invoke({"command": "ls docs"}).value["stdout"].strip() == "a.txt"
    assert RunBashTool(ws, enabled=True, timeout=0.5).invoke({"command": "sleep 5"}).error["type"] == "timeout"
