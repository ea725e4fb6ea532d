"""Static checks of a template: every ``{stage.output…}`` reference is defined on every path that reaches it.

A stage's output exists only after the stage succeeded; a path that skips it, or leaves it through ``on_failed``,
reaches the reference with nothing there and the run fails at run time. This finds such paths before any run
(a must-be-defined dataflow over the edge list).
"""
from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from typing import Any

from agenttune_lib.decide.config import TemplateConfig
from agenttune_lib.decide.interpolate import references

__all__ = ["undefined_references", "stage_references"]

_TEXT_KEYS = ("prompt", "system", "summary", "question", "rubric", "args", "verdict", "inject")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _rule_paths(source: str) -> list[str]:
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            path = _dotted(node)
            if path:
                out.append(path)
    return out


def stage_references(stage: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(referenced stage id, the reference text) for every ``X.output…`` the stage reads (prompts, args, verdicts,
    rules, router conditions and fields)."""
    paths: list[str] = []
    for key in _TEXT_KEYS:
        for text in _strings(stage.get(key)):
            paths += references(text)
    for rule in stage.get("rules") or []:
        if isinstance(rule, Mapping):
            paths += _rule_paths(str(rule.get("condition", "")))
            for text in _strings(rule.get("inject")):
                paths += references(text)
    for cond in stage.get("conditions") or []:
        if isinstance(cond, Mapping):
            paths += _rule_paths(str(cond.get("when", "")))
    if isinstance(stage.get("field"), str):
        paths.append(stage["field"])
    out = []
    for path in paths:
        parts = path.split(".")
        if len(parts) >= 2 and parts[1] == "output":
            out.append((parts[0], path))
    return out


def undefined_references(cfg: TemplateConfig) -> list[str]:
    """One message per reference to a stage output that some path reaches without that stage having succeeded."""
    stages = {s["id"]: s for s in cfg.stages}
    branch_ids = {sid: [b["id"] for b in s.get("branches") or []] for sid, s in stages.items()}
    every = set(stages) | {b for ids in branch_ids.values() for b in ids}
    incoming: dict[str, list[tuple[str, bool]]] = {sid: [] for sid in stages}
    for edge in cfg.edges:
        failed = edge.get("condition") == "on_failed" and stages[edge["source"]]["type"] != "human_review"
        incoming[edge["target"]].append((edge["source"], not failed))
    defined: dict[str, set[str]] = {sid: set(every) for sid in stages}
    defined[cfg.entry] = set()
    changed = True
    while changed:
        changed = False
        for sid in stages:
            if sid == cfg.entry:
                continue
            sets = []
            for source, ok in incoming[sid]:
                out = set(defined[source])
                if ok:
                    out |= {source, *branch_ids[source]}
                sets.append(out)
            new = set.intersection(*sets) if sets else set(every)
            if new != defined[sid]:
                defined[sid] = new
                changed = True
    problems = []
    for sid, stage in stages.items():
        own = defined[sid] | set(branch_ids[sid]) if stage["type"] == "parallel" else defined[sid]
        for target, ref in stage_references(stage):
            if target not in every:
                problems.append(f"stage {sid!r} reads {{{ref}}}, but there is no stage {target!r}")
            elif target not in own and target != sid:
                problems.append(f"stage {sid!r} reads {{{ref}}}, but some path reaches {sid!r} without {target!r} having produced an output")
        for branch in stage.get("branches") or []:
            for target, ref in stage_references(branch):
                if target not in every:
                    problems.append(f"branch {branch['id']!r} reads {{{ref}}}, but there is no stage {target!r}")
                elif target not in defined[sid]:
                    problems.append(f"branch {branch['id']!r} reads {{{ref}}}, but some path reaches {sid!r} without {target!r} having produced an output")
    return problems
