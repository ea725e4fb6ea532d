"""The eight stage types of paper Table 5, registered by type name."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agenttune_lib.decide.stages.base import Stage, StageContext, StageResult, extract_json
from agenttune_lib.decide.stages.external import HumanReviewStage, ToolCallStage
from agenttune_lib.decide.stages.flow import OutputStage, ParallelStage, RulesStage
from agenttune_lib.decide.stages.llm import LLMCallStage, LLMJudgeStage, RouterStage

__all__ = [
    "STAGE_CLASSES",
    "STAGE_REGISTRY",
    "Stage",
    "StageContext",
    "StageResult",
    "extract_json",
    "make_stage",
    "LLMCallStage",
    "RouterStage",
    "LLMJudgeStage",
    "RulesStage",
    "ParallelStage",
    "ToolCallStage",
    "HumanReviewStage",
    "OutputStage",
]

STAGE_CLASSES: dict[str, type[Stage]] = {
    cls.type: cls
    for cls in (LLMCallStage, RouterStage, LLMJudgeStage, RulesStage, ParallelStage, ToolCallStage, HumanReviewStage, OutputStage)
}

#: The same mapping under the name the paper's Table 5 caption suggests ("all registered").
STAGE_REGISTRY = STAGE_CLASSES


def make_stage(spec: Mapping[str, Any], config: Any) -> Stage:
    """The Stage object for one validated stage spec."""
    return STAGE_CLASSES[spec["type"]](spec, config)
