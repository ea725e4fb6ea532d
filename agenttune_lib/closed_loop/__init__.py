"""The self-healing closed loop: detect, classify, generate, buffer, trigger, gate, deploy."""
from agenttune_lib.closed_loop.buffer import BufferStats, RetrainBatch, RetrainRunning, TrainingBuffer
from agenttune_lib.closed_loop.trigger import TRIGGERS, RetrainingTrigger, TriggerConfig, TriggerDecision, TriggerFiring
from agenttune_lib.closed_loop.types import ROOT_CAUSES, Classification, Failure, Run, TrainingExample

__all__ = [
    "BufferStats", "RetrainBatch", "RetrainRunning", "TrainingBuffer",
    "TRIGGERS", "RetrainingTrigger", "TriggerConfig", "TriggerDecision", "TriggerFiring",
    "ROOT_CAUSES", "Classification", "Failure", "Run", "TrainingExample",
]
