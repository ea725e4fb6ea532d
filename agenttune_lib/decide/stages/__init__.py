"""The eight stage types of paper Table 5, registered by type name."""
from __future__ import annotations


from agenttune_lib.decide.stages.base import STAGE_CLASSES, Stage, StageContext, StageResult, extract_json, make_stage
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

STAGE_CLASSES.update({
    cls.type: cls
    for cls in (LLMCallStage, RouterStage, LLMJudgeStage, RulesStage, ParallelStage, ToolCallStage, HumanReviewStage, OutputStage)
})

#: The same mapping under the name the paper's Table 5 caption suggests ("all registered").
STAGE_REGISTRY = STAGE_CLASSES

