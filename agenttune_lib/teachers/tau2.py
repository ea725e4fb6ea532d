"""τ² retail expert: replays each task's gold action list through the real τ² harness, then tells the customer what was done.

The tool results are the harness's own; the episode reward is its database match, so a
replay that did not reach the gold state is visible as reward 0. Tasks whose gold actions
leave the database unchanged are not demonstrations of a state change (doing nothing
already "matches"); ``is_demonstration`` flags them and collection skips them by default.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agenttune_lib.spine.state import Generation
from agenttune_lib.teachers.base import TeacherInfo, count_assistant_turns, scripted_generation, tool_call_text

__all__ = ["Tau2ExpertTeacher", "tau2_final_message"]

_DONE = {
    "cancel_pending_order": "I cancelled order {order_id}.",
    "modify_pending_order_address": "I updated the shipping address of order {order_id}.",
    "modify_pending_order_items": "I modified the items of order {order_id}.",
    "modify_pending_order_payment": "I changed the payment method of order {order_id}.",
    "return_delivered_order_items": "I started the return for order {order_id}.",
    "exchange_delivered_order_items": "I started the exchange for order {order_id}.",
    "modify_user_address": "I updated your default address.",
    "transfer_to_human_agents": "I transferred you to a human agent.",
}


def tau2_final_message(task: Any) -> str:
    """The closing assistant message: what the gold actions changed, and the information the customer asked for."""
    parts = []
    for action in task.actions:
        template = _DONE.get(action["name"])
        if template:
            parts.append(template.format(order_id=(action.get("arguments") or {}).get("order_id", "")))
    if not parts:
        parts.append("I have looked into your request.")
    if task.communicate_info:
        parts.append("The information you asked for: " + ", ".join(str(c) for c in task.communicate_info) + ".")
    return " ".join(parts)


class Tau2ExpertTeacher:
    """A scripted policy: messages in, the task's next gold action (or the closing message) out, as student tokens.

    It finds the task from the customer's brief in the first user message, so it is also
    usable as a policy by evaluation suites that render the same τ² prompt.
    """

    info = TeacherInfo("expert_tau2", "gold-replay/1")

    def __init__(self, tokenizer: Any = None, tasks: Sequence[Any] | None = None) -> None:
        from agenttune_lib.spine.tau2 import load_tau2_tasks

        self.tokenizer = tokenizer
        self.tasks = list(tasks) if tasks is not None else load_tau2_tasks("all")
        self._by_prompt = {t.prompt.strip(): t for t in self.tasks}

    def task_for(self, messages: Sequence[dict[str, str]]) -> Any:
        """The task whose customer brief is the first user message (exact, then contained)."""
        user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
        text = user.strip() if isinstance(user, str) else ""
        task = self._by_prompt.get(text)
        if task is None:
            task = next((t for p, t in self._by_prompt.items() if p and p in text), None)
        if task is None:
            raise LookupError(f"Tau2ExpertTeacher: no τ² task has this customer brief: {text[:120]!r}")
        return task

    def next_text(self, messages: Sequence[dict[str, str]]) -> str:
        """The gold action for this step, or the closing message once every gold action was taken."""
        task = self.task_for(messages)
        step = count_assistant_turns(messages)
        if step < len(task.actions):
            action = task.actions[step]
            return tool_call_text(action["name"], dict(action.get("arguments") or {}))
        return tau2_final_message(task)

    def __call__(self, messages: Any) -> Generation | str:
        if isinstance(messages, str):
            raise TypeError("Tau2ExpertTeacher needs chat messages (input_format='messages'), got a prompt string")
        text = self.next_text(messages)
        return scripted_generation(self.tokenizer, messages, text) if self.tokenizer is not None else text

    @staticmethod
    def is_demonstration(task: Any) -> bool:
        """Whether the gold actions change the database (a task whose gold state is the initial state teaches no action)."""
        from agenttune_lib.spine.tau2 import db_hash, fresh_db, replay_actions

        return db_hash(replay_actions(task.actions)) != db_hash(fresh_db())

    @staticmethod
    def steps_needed(task: Any) -> int:
        """Harness/strategy step budget that lets the replay finish: every gold action plus the closing message."""
        return len(task.actions) + 1
