"""BFCL-style single-call tasks built from the platform's own τ² retail data (never BFCL's test categories).

Each task is a customer brief plus one goal ("find the customer's user id", "look up the order");
the policy must answer with exactly one call. Scoring is BFCL's AST idea: the function name and
every expected argument value must match. The call is parsed and scored, not executed.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ToolCallEnvironment", "tool_call_tasks", "call_match", "CANDIDATE_TOOLS"]

CANDIDATE_TOOLS = ("find_user_id_by_email", "find_user_id_by_name_zip", "get_order_details", "get_user_details", "get_product_details")
INSTRUCTIONS = "You are a retail support agent. Reply with exactly one tool call that does what is asked, and nothing else."
GOALS = {
    "find_user_id_by_name_zip": "Find this customer's user id.",
    "find_user_id_by_email": "Find this customer's user id.",
    "get_order_details": "Look up the details of the order the customer mentions.",
}


def _norm(value: Any) -> str:
    return re.sub(r"\s+", " ", str(value).strip().lower())


def call_match(expected: Mapping[str, Any], completion: Any) -> tuple[bool, float, bool]:
    """(name matches, share of expected arguments matched, exact) for the first assistant turn's single call."""
    from agenttune_lib.rl.rewards._text import messages_of, tool_calls

    first = next((m for m in messages_of(completion) if m.get("role", "assistant") == "assistant"), None)
    if first is None:
        return False, 0.0, False
    calls, errors = tool_calls([first])
    if len(calls) != 1 or errors:
        return False, 0.0, False
    call = calls[0]
    if call.name != expected["name"]:
        return False, 0.0, False
    want = dict(expected.get("arguments") or {})
    got = call.arguments
    hits = sum(1 for k, v in want.items() if k in got and _norm(got[k]) == _norm(v))
    share = hits / len(want) if want else 1.0
    extra = set(got) - set(want)
    return True, share, share == 1.0 and not extra


class ToolCallEnvironment:
    """One single-call task per episode. Reward: 1.0 exact call; with ``partial_credit``, 0.5 for the right function
    plus 0.4 × the share of arguments right (a correctness grade, not a format bonus); 0.0 otherwise."""

    name = "tool_call"
    max_tool_turns = 0
    tool_format = "compact"  # signature lines (name, parameters, description) when the template has no tool format

    def __init__(self, partial_credit: bool = True) -> None:
        self.partial_credit = partial_credit
        self.task: dict[str, Any] | None = None

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        for key in ("request", "expected"):
            if key not in task:
                raise ValueError(f"tool_call task lacks {key!r} (task_id={task.get('task_id')!r})")
        self.task = dict(task)
        return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": str(task["request"])}]

    def tools(self) -> list[Any]:
        from agenttune_lib.spine.tau2 import Tau2RetailTool, fresh_db, tau2_tool_schemas

        self.db = fresh_db()
        names = (self.task or {}).get("tools") or list(CANDIDATE_TOOLS)
        return [Tau2RetailTool(s, self) for s in tau2_tool_schemas() if s["function"]["name"] in names]

    def _score(self, completion: Any) -> tuple[bool, float, bool]:
        if self.task is None:
            raise RuntimeError("tool_call: reward before reset(task)")
        return call_match(self.task["expected"], completion)

    def reward(self, completion: list[dict[str, Any]]) -> float:
        name_ok, share, exact = self._score(completion)
        if exact:
            return 1.0
        return round(0.5 + 0.4 * share, 6) if (self.partial_credit and name_ok) else 0.0

    def success(self, completion: list[dict[str, Any]]) -> bool:
        return self._score(completion)[2]

    def metrics(self, completion: list[dict[str, Any]]) -> dict[str, Any]:
        name_ok, share, exact = self._score(completion)
        return {"call_name_ok": name_ok, "call_args_share": share, "call_exact": exact}


def tool_call_tasks(split: str = "train", limit: int | None = None, goals: Sequence[str] = tuple(GOALS)) -> list[dict[str, Any]]:
    """Single-call tasks from τ² retail ``split``: per task, its first user lookup and its first order lookup whose
    argument values appear in the customer's brief (so the call is answerable from the request alone)."""
    from agenttune_lib.spine.tau2 import load_tau2_tasks

    out = []
    for t in load_tau2_tasks(split):
        seen_goal = set()
        for action in t.actions:
            name = action["name"]
            if name not in goals or GOALS[name] in seen_goal:
                continue
            args = dict(action.get("arguments") or {})
            if not args or not all(_norm(v) in _norm(t.prompt) for v in args.values()):
                continue
            seen_goal.add(GOALS[name])
            out.append({
                "task_id": f"{t.id}:{name}", "split": t.split,
                "request": f"{t.prompt}\n\nNow: {GOALS[name]}",
                "expected": {"name": name, "arguments": args}, "tools": list(CANDIDATE_TOOLS),
            })
    return out[:limit] if limit is not None else out
