"""Evaluation: deterministic trajectory metrics, model metrics, and calibration on BFCL and tau2-bench."""
from agenttune_lib.evaluation.trajectory import TRAJECTORY_METRICS, JudgeRubric, TrajectoryEvaluator

__all__ = ["TRAJECTORY_METRICS", "JudgeRubric", "TrajectoryEvaluator"]
