"""Model teachers: a larger LLM over an OpenAI-compatible endpoint, and the bundled model behind rejection sampling.

Either way each turn's text is re-rendered as the student's own tokens, so the logs are
full tier in the student's chat template whatever model wrote them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from agenttune_lib.spine.state import Generation
from agenttune_lib.teachers.base import TeacherInfo, scripted_generation

__all__ = ["EndpointTeacher", "RejectionSampling"]


class EndpointTeacher:
    """Messages in, the endpoint model's reply out, rendered as the student's tokens (``tokenizer``)."""

    def __init__(self, base_url: str, model: str, tokenizer: Any = None, api_key: str | None = None, max_tokens: int = 256, temperature: float = 0.0) -> None:
        if not base_url or not model:
            raise ValueError("EndpointTeacher needs base_url and model (an OpenAI-compatible /chat/completions endpoint)")
        self.base_url, self.model, self.tokenizer = base_url, model, tokenizer
        self.api_key, self.max_tokens, self.temperature = api_key, max_tokens, temperature
        self.info = TeacherInfo("llm_endpoint", f"{model}@{base_url}")

    def __call__(self, messages: Any) -> Generation | str:
        from agenttune_lib.models.openai_compat import chat_completion

        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        text = chat_completion(
            self.base_url, self.model, messages, api_key=self.api_key, max_tokens=self.max_tokens, temperature=self.temperature
        ).text
        return scripted_generation(self.tokenizer, messages, text) if self.tokenizer is not None else text


@dataclasses.dataclass(frozen=True)
class RejectionSampling:
    """Keep a model teacher's episode only when its reward reaches ``threshold``, trying up to ``attempts`` times.

    Needed for the bundled model as teacher: unfiltered, its failed episodes would be
    distilled as if they were demonstrations.
    """

    attempts: int = 4
    threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RejectionSampling.attempts must be >= 1, got {self.attempts}")

    def run(self, episode: Callable[[int], Any]) -> tuple[Any | None, int]:
        """Call ``episode(attempt)`` until a log reaches the threshold; (the accepted log or None, attempts used)."""
        from agenttune_lib.spine.episode import episode_succeeded

        for attempt in range(self.attempts):
            log = episode(attempt)
            if episode_succeeded(log, self.threshold):
                log.metadata["rejection_sampling"] = {"accepted": True, "attempt": attempt + 1, "of": self.attempts, "threshold": self.threshold}
                return log, attempt + 1
        return None, self.attempts
