"""The values that move between a strategy, a harness and the episode driver."""
from __future__ import annotations

import dataclasses
from typing import Any

from agenttune_lib.events import Event

__all__ = ["Action", "AgentState", "StepResult", "Generation"]


@dataclasses.dataclass
class Generation:
    """A model completion with the token ids and logprobs behind it (a full-tier rollout's raw material)."""

    text: str
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    #: The chat messages this completion was generated from (set by the spine when it calls the model).
    messages: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"Generation.text must be a string, got {type(self.text).__name__}")
        if self.logprobs is not None and self.completion_ids is None:
            raise ValueError("Generation has logprobs but no completion_ids to index them")
        if self.logprobs is not None and len(self.logprobs) != len(self.completion_ids or ()):
            raise ValueError(
                f"Generation.logprobs has {len(self.logprobs)} values for {len(self.completion_ids or ())} completion_ids; "
                "a full-tier record needs exactly one logprob per generated token"
            )

    @property
    def has_tokens(self) -> bool:
        """Whether this completion carries token ids (a full-tier record) rather than text only."""
        return bool(self.completion_ids)

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass
class Action:
    """One agent move: a tool call, a final answer, or a malformed call (kind ``invalid``).

    ``reasoning`` is the model text around a call; ``raw`` the whole completion; ``error``
    the structured parse error of an invalid action; ``generation`` its token-level record.
    """

    kind: str
    name: str | None = None
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    id: str | None = None
    text: str = ""
    reasoning: str = ""
    raw: str = ""
    error: dict[str, Any] | None = None
    score: float | None = None
    generation: Generation | None = None

    KINDS = ("tool_call", "answer", "invalid")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"Action.kind must be one of {self.KINDS}, got {self.kind!r}")
        if self.kind == "tool_call" and not self.name:
            raise ValueError("a tool_call Action needs a tool name")

    @classmethod
    def call(cls, name: str, arguments: dict[str, Any] | None = None, **kw: Any) -> "Action":
        return cls("tool_call", name=name, arguments=dict(arguments or {}), **kw)

    @classmethod
    def answer(cls, text: str, **kw: Any) -> "Action":
        return cls("answer", text=text, **kw)

    def describe(self) -> dict[str, Any]:
        """JSON-safe summary (for rejected-branch records and preference pairs)."""
        out: dict[str, Any] = {"kind": self.kind, "text": self.raw or self.text}
        if self.kind == "tool_call":
            out.update(name=self.name, arguments=self.arguments)
        if self.error:
            out["error"] = self.error
        if self.score is not None:
            out["score"] = self.score
        return out


@dataclasses.dataclass
class StepResult:
    """What one harness step produced: the new events, the step reward and whether the episode ended."""

    events: list[Event]
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def error(self) -> dict[str, Any] | None:
        for event in self.events:
            if event.is_error:
                return event.payload.get("error")
        return None

    @property
    def observation(self) -> str:
        """Text of the tool results / observations of this step."""
        parts = []
        for event in self.events:
            if event.kind.value in ("tool_result", "observation"):
                content = event.payload.get("content", "")
                parts.append(content if isinstance(content, str) else str(content))
        return "\n".join(parts)


@dataclasses.dataclass
class AgentState:
    """A strategy's view of one episode; ``scratch`` is the strategy's private working area."""

    task: Any
    events: list[Event] = dataclasses.field(default_factory=list)
    step: int = 0
    done: bool = False
    scratch: dict[str, Any] = dataclasses.field(default_factory=dict)

    def emit(self, event: Event) -> None:
        """Queue an event the strategy itself produces (e.g. MEMORY_OP) for the harness log."""
        self.scratch.setdefault("_emit", []).append(event)

    def drain(self) -> list[Event]:
        return self.scratch.pop("_emit", [])
