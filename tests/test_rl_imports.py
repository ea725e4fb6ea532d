"""The RL core has no import circle (issue 30): data, factory, ray_engine, rollout and trl_trainers used to form one."""
from __future__ import annotations

import ast
from pathlib import Path

RL = Path(__file__).resolve().parents[1] / "agenttune_lib" / "rl"


def _edges() -> dict[str, set[str]]:
    """Module -> RL modules it imports, at any depth (function-level imports count)."""
    mods = {".".join(p.relative_to(RL.parent.parent).with_suffix("").parts).removesuffix(".__init__"): p for p in RL.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] + [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and node.module else [])
            edges[m] |= {n for n in names if n in mods and n != m and n != "agenttune_lib.rl"}
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(edges[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(edges):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_the_rl_package_has_no_import_circle():
    edges = _edges()
    assert "agenttune_lib.rl.ray_engine" not in edges["agenttune_lib.rl.rollout"]
    assert "agenttune_lib.rl.factory" not in edges["agenttune_lib.rl.ray_engine"]
    assert _cycle(edges) is None, f"import circle: {' -> '.join(_cycle(edges))}"


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
