"""Built-in tools: file read/write/list and grep confined to a workspace; Python and Bash execution, off unless enabled."""
from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from agenttune_lib.tools.base import BaseTool, ToolError

__all__ = [
    "Workspace",
    "ReadFileTool",
    "WriteFileTool",
    "ListFilesTool",
    "GrepTool",
    "RunPythonTool",
    "RunBashTool",
    "builtin_tools",
]


class Workspace:
    """A directory every file tool is confined to; paths that resolve outside it are refused."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise NotADirectoryError(f"workspace {self.root} is not a directory")

    def resolve(self, path: str) -> Path:
        if not isinstance(path, str) or not path:
            raise ToolError("path must be a non-empty string", type="invalid_path")
        target = (self.root / path).resolve()
        if target != self.root and not target.is_relative_to(self.root):
            raise ToolError(f"path {path!r} is outside the workspace", type="outside_workspace", path=path)
        return target

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.root)) or "."


class _WorkspaceTool(BaseTool):
    def __init__(self, workspace: Workspace | str | Path) -> None:
        self.workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)


class ReadFileTool(_WorkspaceTool):
    name = "read_file"
    description = "Read a text file in the workspace."
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "Path relative to the workspace."}},
        "required": ["path"],
        "additionalProperties": False,
    }
    max_chars = 100_000

    def execute(self, path: str) -> str:
        target = self.workspace.resolve(path)
        if not target.is_file():
            raise ToolError(f"no file {path!r} in the workspace", type="not_found", path=path)
        text = target.read_text(errors="replace")
        return text if len(text) <= self.max_chars else text[: self.max_chars] + f"\n… [{len(text) - self.max_chars} more characters]"


class WriteFileTool(_WorkspaceTool):
    name = "write_file"
    description = "Write (or append) text to a file in the workspace, creating parent folders."
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path relative to the workspace."},
            "content": {"type": "string"},
            "append": {"type": "boolean", "default": False},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    def execute(self, path: str, content: str, append: bool = False) -> str:
        target = self.workspace.resolve(path)
        if target.is_dir():
            raise ToolError(f"{path!r} is a directory", type="is_directory", path=path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a" if append else "w") as fh:
            fh.write(content)
        return f"wrote {len(content)} characters to {self.workspace.rel(target)}"


class ListFilesTool(_WorkspaceTool):
    name = "list_files"
    description = "List files under a workspace folder, optionally filtered by a glob pattern."
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "default": "."},
            "pattern": {"type": "string", "default": "*"},
            "recursive": {"type": "boolean", "default": True},
        },
        "additionalProperties": False,
    }
    max_entries = 500

    def execute(self, path: str = ".", pattern: str = "*", recursive: bool = True) -> list[str]:
        base = self.workspace.resolve(path)
        if not base.is_dir():
            raise ToolError(f"no folder {path!r} in the workspace", type="not_found", path=path)
        found = base.rglob("*") if recursive else base.iterdir()
        out = sorted(self.workspace.rel(p) for p in found if p.is_file() and fnmatch.fnmatch(p.name, pattern))
        return out[: self.max_entries]


class GrepTool(_WorkspaceTool):
    name = "grep"
    description = "Search workspace files for a regular expression; returns file:line: text matches."
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Python regular expression."},
            "path": {"type": "string", "default": "."},
            "glob": {"type": "string", "default": "*"},
            "max_matches": {"type": "integer", "default": 100, "minimum": 1},
            "ignore_case": {"type": "boolean", "default": False},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def execute(self, pattern: str, path: str = ".", glob: str = "*", max_matches: int = 100, ignore_case: bool = False) -> list[str]:
        try:
            regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            raise ToolError(f"invalid regular expression {pattern!r}: {exc}", type="invalid_pattern") from None
        base = self.workspace.resolve(path)
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file() and fnmatch.fnmatch(p.name, glob))
        out: list[str] = []
        for file in files:
            try:
                lines = file.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for n, line in enumerate(lines, 1):
                if regex.search(line):
                    out.append(f"{self.workspace.rel(file)}:{n}: {line[:300]}")
                    if len(out) >= max_matches:
                        return out
        return out


class _CodeTool(_WorkspaceTool):
    """Runs model-generated code in a subprocess in the workspace; disabled unless ``enabled=True``."""

    def __init__(self, workspace: Workspace | str | Path, enabled: bool = False, timeout: float = 10.0) -> None:
        super().__init__(workspace)
        self.enabled = enabled
        self.timeout = timeout

    def _run(self, argv: Any, shell: bool) -> dict[str, Any]:
        if not self.enabled:
            raise ToolError(f"{self.name} is disabled; construct it with enabled=True to run code", type="disabled")
        try:
            proc = subprocess.run(argv, shell=shell, cwd=self.workspace.root, capture_output=True, text=True, timeout=self.timeout, env=dict(os.environ))
        except subprocess.TimeoutExpired:
            raise ToolError(f"{self.name} timed out after {self.timeout}s", type="timeout") from None
        return {"returncode": proc.returncode, "stdout": proc.stdout[-20_000:], "stderr": proc.stderr[-20_000:]}


class RunPythonTool(_CodeTool):
    name = "run_python"
    description = (
        "Run Python source in a subprocess in the workspace and return stdout, stderr and the exit code. "
        "WARNING: the code runs with this process's full rights (files, network, credentials); off unless enabled."
    )
    parameters = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"], "additionalProperties": False}

    def execute(self, code: str) -> dict[str, Any]:
        return self._run([sys.executable, "-c", code], shell=False)


class RunBashTool(_CodeTool):
    name = "run_bash"
    description = (
        "Run a shell command (bash -c) in the workspace and return stdout, stderr and the exit code. "
        "WARNING: the command runs with this process's full rights (files, network, credentials); off unless enabled."
    )
    parameters = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"], "additionalProperties": False}

    def execute(self, command: str) -> dict[str, Any]:
        return self._run(["bash", "-c", command], shell=False)


def builtin_tools(workspace: str | Path, enable_code_execution: bool = False, timeout: float = 10.0) -> dict[str, BaseTool]:
    """The file tools for ``workspace``; the Python and Bash tools only with ``enable_code_execution=True``."""
    ws = Workspace(workspace)
    tools: list[BaseTool] = [ReadFileTool(ws), WriteFileTool(ws), ListFilesTool(ws), GrepTool(ws)]
    if enable_code_execution:
        tools += [RunPythonTool(ws, enabled=True, timeout=timeout), RunBashTool(ws, enabled=True, timeout=timeout)]
    return {t.name: t for t in tools}
