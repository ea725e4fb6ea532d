"""The stage contract: a Stage reads PipelineState and returns a StageResult; the runner routes."""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agenttune_lib.decide.config import TemplateConfig
from agenttune_lib.decide.errors import StageError
from agenttune_lib.decide.interpolate import InterpolationError, interpolate, interpolate_value
from agenttune_lib.decide.state import PipelineState

__all__ = ["STAGE_CLASSES", "Stage", "StageContext", "StageResult", "extract_json", "jsonable", "make_stage"]


def jsonable(value: Any) -> Any:
    """A JSON-safe copy (tool values and model outputs reach the audit log and the EventLog)."""
    return json.loads(json.dumps(value, default=str, allow_nan=False)) if value is not None else None


def extract_json(text: str) -> Any:
    """The first JSON object in a model reply (code fences and surrounding prose allowed)."""
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.strip("`")
        if stripped.lower().startswith("json"):
            stripped = stripped[4:]
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch == "{":
            try:
                value, _ = decoder.raw_decode(text[i:])
            except ValueError:
                continue
            return value
    snippet = text.strip().replace("\n", " ")[:120]
    raise ValueError(f"reply is not JSON: {snippet!r}")


@dataclasses.dataclass
class StageContext:
    """What a stage may use besides the state: models, tools, the review folder, clocks, overrides."""

    config: TemplateConfig
    models: dict[str, Any]
    tools: dict[str, Any]
    review_dir: Path
    redact: Callable[[Any], Any] = lambda value: value
    human_review_timeout: float | None = None
    #: Park a run at a human_review (LangGraph interrupt + checkpointer) instead of failing it closed at once.
    suspend: bool = False
    max_new_tokens: int | None = None
    max_retries: int | None = None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep

    @property
    def settings(self) -> dict[str, Any]:
        return self.config.settings

    def llm_setting(self, spec: Mapping[str, Any], key: str, default: Any) -> Any:
        return spec.get(key, (self.settings.get("llm") or {}).get(key, default))


@dataclasses.dataclass
class StageResult:
    """One stage's outcome. ``next`` overrides the stage's default route; ``None`` means take it."""

    output: Any = None
    status: str = "ok"
    error: Any = None
    next: str | None = None
    score: float | None = None
    tool: str | None = None
    args: Any = None
    prompt: str | None = None
    attempts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    branch_steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class Stage:
    """Base class; subclasses set ``type`` and implement ``execute``."""

    type: str = ""

    def __init__(self, spec: Mapping[str, Any], config: TemplateConfig) -> None:
        self.spec = dict(spec)
        self.id: str = self.spec["id"]
        self.config = config

    def error(self, message: str, detail: Any = None) -> StageError:
        return StageError(message, template=self.config.id, stage=self.id, detail=detail)

    def interpolate(self, text: str, state: PipelineState) -> str:
        try:
            return interpolate(text, state.namespace())
        except InterpolationError as exc:
            raise self.error(str(exc)) from None

    def interpolate_value(self, value: Any, state: PipelineState) -> Any:
        try:
            return interpolate_value(value, state.namespace())
        except InterpolationError as exc:
            raise self.error(str(exc)) from None

    def check(self, ctx: StageContext) -> None:
        """Compile-time checks that need the runner's models and tools."""

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:  # pragma: no cover - abstract
        raise NotImplementedError


#: Stage class per type name; the package fills it with the eight types of paper Table 5 (here, below the
#: stages, so a composite stage such as ``parallel`` builds its branches without importing the package).
STAGE_CLASSES: dict[str, type[Stage]] = {}


def make_stage(spec: Mapping[str, Any], config: Any) -> Stage:
    """The Stage object for one validated stage spec."""
    return STAGE_CLASSES[spec["type"]](spec, config)
