"""DECIDE: YAML decision workflows compiled to LangGraph: schema-constrained model stages, a keyed audit chain,
PII redaction on everything that leaves a run, and human reviews that park their run until a decision arrives."""
from agenttune_lib.decide.audit import (
    AuditReader,
    AuditVerification,
    AuditWriter,
    Redactor,
    default_audit_path,
    require_verified,
    verify_audit,
)
from agenttune_lib.decide.checkpoint import make_checkpointer, validate_run_id
from agenttune_lib.decide.evaluate import DecideEvaluation, evaluate_template
from agenttune_lib.decide.review import ResumeOutcome, pending_reviews, resume_decided
from agenttune_lib.decide.collect import (
    CollectResult,
    CollectRunner,
    DecideToTrainerBridge,
    extract_bco_labels,
    extract_dpo_pairs,
)
from agenttune_lib.decide.config import STAGE_TYPES, ConfigLoader, TemplateConfig, default_templates_dir
from agenttune_lib.decide.destinations import (
    DestinationRouter,
    DuckDBDestination,
    FileDestination,
    PostgresDestination,
)
from agenttune_lib.decide.errors import AuditError, DecideError, RuleError, StageError, TemplateError
from agenttune_lib.decide.inputs import read_inputs, read_labelled_inputs
from agenttune_lib.decide.models import (
    ModelRequest,
    OpenAICompatibleModel,
    ScriptedModel,
    TransformersModel,
    as_model,
    build_model,
)
from agenttune_lib.decide.registry import TemplateRegistry
from agenttune_lib.decide.rules import Rule, compile_rule, evaluate_rule
from agenttune_lib.decide.runner import GraphRunner
from agenttune_lib.decide.state import PipelineState

__all__ = [
    "AuditError",
    "AuditReader",
    "AuditVerification",
    "AuditWriter",
    "CollectResult",
    "CollectRunner",
    "ConfigLoader",
    "DecideError",
    "DecideToTrainerBridge",
    "DestinationRouter",
    "DuckDBDestination",
    "FileDestination",
    "GraphRunner",
    "ModelRequest",
    "OpenAICompatibleModel",
    "PipelineState",
    "PostgresDestination",
    "Redactor",
    "Rule",
    "RuleError",
    "STAGE_TYPES",
    "ScriptedModel",
    "StageError",
    "TemplateConfig",
    "TemplateError",
    "TemplateRegistry",
    "TransformersModel",
    "as_model",
    "build_model",
    "read_inputs",
    "read_labelled_inputs",
    "compile_rule",
    "default_audit_path",
    "default_templates_dir",
    "evaluate_rule",
    "extract_bco_labels",
    "extract_dpo_pairs",
    "verify_audit",
    "require_verified",
    "make_checkpointer",
    "validate_run_id",
    "DecideEvaluation",
    "evaluate_template",
    "ResumeOutcome",
    "pending_reviews",
    "resume_decided",
]
