"""τ²'s user simulator: a chat model plays the customer from the task's whole instruction.

Configure it with any model callable (messages in, text or a Generation out: a local
``ChatGenerator``, a scripted function) or an OpenAI-compatible endpoint
(``Tau2UserSimulator.openai``). The simulator sees the conversation from the customer's side:
the agent's messages are its ``user`` turns, its own are ``assistant`` turns. It ends the
episode with τ²'s control tokens (``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###``).
"""
from __future__ import annotations

import os
from typing import Any

from agenttune_lib.spine.state import Generation

__all__ = ["Tau2UserSimulator", "USER_GUIDELINES", "STOP_TOKENS", "nl_assertion_judge"]

STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")

USER_GUIDELINES = (
    "You are playing the role of a customer contacting a customer service representative. "
    "Your goal is to simulate a realistic customer following the scenario below.\n"
    "- Write one message at a time, as the customer would, in plain text.\n"
    "- Do not reveal everything at once: give information only when it is needed or asked for.\n"
    "- Never invent information the scenario does not give you; if asked for something you do not know, say so.\n"
    "- When the task in the scenario is complete, reply with ###STOP### alone.\n"
    "- If you are transferred to another agent, reply with ###TRANSFER### alone.\n"
    "- If the scenario gives you nothing to continue with, reply with ###OUT-OF-SCOPE### alone.\n\n"
    "<scenario>\n{instruction}\n</scenario>"
)

AGENT_GREETING = "Hi! How can I help you today?"


class Tau2UserSimulator:
    """The customer side of a τ² episode; ``start(task)`` opens, ``reply(agent_text)`` answers."""

    def __init__(self, model: Any, max_turns: int = 20) -> None:
        if not callable(model):
            raise TypeError(f"the user simulator needs a model callable (messages -> text), got {type(model).__name__}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive integer, got {max_turns!r}")
        self.model = model
        self.max_turns = max_turns
        self.system = ""
        self.history: list[dict[str, str]] = []

    @classmethod
    def openai(cls, base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY", temperature: float = 0.0, **kw: Any) -> "Tau2UserSimulator":
        """A simulator over an OpenAI-compatible ``/chat/completions`` endpoint (key read from ``api_key_env``)."""
        from agenttune_lib.models.openai_compat import chat_completion

        key = os.environ.get(api_key_env) if api_key_env else None

        def call(messages: Any) -> str:
            return chat_completion(base_url, model, messages, api_key=key, temperature=temperature).text

        return cls(call, **kw)

    def _ask(self) -> str:
        out = self.model([{"role": "system", "content": self.system}, *self.history])
        text = out.text if isinstance(out, Generation) else out
        if not isinstance(text, str):
            raise TypeError(f"user simulator model returned {type(out).__name__}; expected str or Generation")
        text = text.strip()
        self.history.append({"role": "assistant", "content": text})
        return text

    def start(self, task: Any) -> str:
        """The customer's opening message, after the agent's greeting."""
        instruction = getattr(task, "instruction", None)
        if not isinstance(instruction, str) or not instruction:
            raise ValueError(f"the user simulator needs a task with an instruction, got {type(task).__name__}")
        self.system = USER_GUIDELINES.format(instruction=instruction)
        self.history = [{"role": "user", "content": AGENT_GREETING}]
        return self._ask()

    def reply(self, agent_text: str) -> tuple[str, bool]:
        """The customer's answer to the agent and whether it ends the conversation."""
        self.history.append({"role": "user", "content": agent_text})
        text = self._ask()
        turns = sum(1 for m in self.history if m["role"] == "assistant")
        stop = any(token in text for token in STOP_TOKENS) or turns >= self.max_turns
        return text, stop


JUDGE_PROMPT = (
    "You check a customer-service conversation against assertions about what the agent did or said. "
    "For each numbered assertion, decide whether the conversation satisfies it. Reply with JSON only: "
    '{"verdicts": [true or false, one per assertion, in order]}.'
)


def nl_assertion_judge(model: Any) -> Any:
    """A τ² NL_ASSERTION judge over a chat model (messages -> text): ``judge(assertions, transcript) -> list[bool]``.

    Pass it as ``Tau2RetailHarness(nl_judge=...)``. An unparseable verdict raises, naming what came back,
    rather than scoring the episode.
    """
    import json

    def judge(assertions: list[str], transcript: list[dict[str, Any]]) -> list[bool]:
        lines = []
        for event in transcript:
            role = "agent" if event.get("kind") == "text" else "customer"
            lines.append(f"{role}: {(event.get('payload') or {}).get('content', '')}")
        body = "Conversation:\n" + "\n".join(lines) + "\n\nAssertions:\n" + "\n".join(f"{i + 1}. {a}" for i, a in enumerate(assertions))
        out = model([{"role": "system", "content": JUDGE_PROMPT}, {"role": "user", "content": body}])
        text = out.text if isinstance(out, Generation) else str(out)
        start, end = text.find("{"), text.rfind("}")
        try:
            verdicts = json.loads(text[start : end + 1])["verdicts"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"NL-assertion judge reply is not {{\"verdicts\": [...]}}: {text[:200]!r}") from None
        if not isinstance(verdicts, list) or len(verdicts) != len(assertions) or not all(isinstance(v, bool) for v in verdicts):
            raise ValueError(f"NL-assertion judge gave {verdicts!r} for {len(assertions)} assertions; expected that many booleans")
        return verdicts

    return judge
