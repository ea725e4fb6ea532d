"""The OpenAI wire format the service speaks (requests validated by pydantic; replies built as plain dicts)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ChatMessage", "FunctionSpec", "ToolSpec", "ChatCompletionRequest", "FeedbackRequest", "ReviewDecisionRequest", "message_text"]


class _Open(BaseModel):
    # Clients send fields this service does not use (logit_bias, user, …): accepted and ignored.
    model_config = ConfigDict(extra="allow")


class ToolCallFunction(_Open):
    name: str
    arguments: str = "{}"


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionSpec(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(_Open):
    type: Literal["function"]
    function: FunctionSpec


class StreamOptions(_Open):
    include_usage: bool = False


class ChatCompletionRequest(_Open):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    response_format: dict[str, Any] | None = None
    #: The end user the client acts for (OpenAI's ``user``): the provenance source of the traffic it produced.
    user: str | None = Field(default=None, max_length=256)
    #: The platform's request option: decode tool calls under their JSON schemas (xgrammar), so a call is well-formed.
    structured_tool_calls: bool = False


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: str = Field(min_length=1, max_length=128)
    reward: float | None = Field(default=None, ge=0.0, le=1.0)
    thumbs: Literal["up", "down"] | None = None
    correction: str | None = Field(default=None, max_length=20000)
    root_cause: str | None = None
    comment: str | None = Field(default=None, max_length=2000)


class ReviewDecisionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["approved", "denied"]
    reviewer: str = Field(min_length=1, max_length=200)
    comment: str | None = Field(default=None, max_length=2000)


def message_text(content: str | list[dict[str, Any]] | None) -> str:
    """A message's text: the string, or the concatenated ``text`` parts of a content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"content part {i} has type {part.get('type')!r}; only text parts are served")
        parts.append(part["text"])
    return "".join(parts)
