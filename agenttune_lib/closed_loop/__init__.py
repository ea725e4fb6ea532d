"""The self-healing closed loop: detect, classify, generate, buffer, trigger, gate, deploy."""
from agenttune_lib.closed_loop.buffer import BufferStats, RetrainBatch, RetrainRunning, TrainingBuffer
from agenttune_lib.closed_loop.classifier import FailureClassifier
from agenttune_lib.closed_loop.deploy import AdapterDeployer, DeployError, Deployment, GateRefused
from agenttune_lib.closed_loop.detector import DetectorConfig, FailureDetector, run_from_eventlog, run_from_pipeline_state
from agenttune_lib.closed_loop.gate import DeploymentGate, GateConfig, GateDecision, HoldoutCase, LikelihoodPolicy, build_holdout
from agenttune_lib.closed_loop.generator import ReferenceCorrector, ReplayValidator, TrainingExampleGenerator
from agenttune_lib.closed_loop.loop import ClosedLoop, IngestReport
from agenttune_lib.closed_loop.trigger import TRIGGERS, RetrainingTrigger, TriggerConfig, TriggerDecision, TriggerFiring
from agenttune_lib.closed_loop.types import ROOT_CAUSES, Classification, Failure, Run, TrainingExample

__all__ = [
    "BufferStats", "RetrainBatch", "RetrainRunning", "TrainingBuffer",
    "FailureClassifier", "AdapterDeployer", "DeployError", "Deployment", "GateRefused",
    "DetectorConfig", "FailureDetector", "run_from_eventlog", "run_from_pipeline_state",
    "DeploymentGate", "GateConfig", "GateDecision", "HoldoutCase", "LikelihoodPolicy", "build_holdout",
    "ReferenceCorrector", "ReplayValidator", "TrainingExampleGenerator", "ClosedLoop", "IngestReport",
    "TRIGGERS", "RetrainingTrigger", "TriggerConfig", "TriggerDecision", "TriggerFiring",
    "ROOT_CAUSES", "Classification", "Failure", "Run", "TrainingExample",
]
