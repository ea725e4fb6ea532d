"""Evaluation: deterministic trajectory metrics, model metrics, and calibration on BFCL and tau2-bench."""
from agenttune_lib.evaluation.metrics import BleuMetric, ExactMatchMetric, Metric, MetricDependencyError, RougeMetric
from agenttune_lib.evaluation.report import aggregate_seeds
from agenttune_lib.evaluation.report_model import EvaluationConfig, EvaluationReport, compare_reports, evaluate_model
from agenttune_lib.evaluation.rl import RLEvaluator
from agenttune_lib.evaluation.settings import EvalSettings
from agenttune_lib.evaluation.tau2 import Tau2Result, run_tau2
from agenttune_lib.evaluation.trajectory import TRAJECTORY_METRICS, JudgeRubric, TrajectoryEvaluator

__all__ = [
    "BleuMetric", "EvalSettings", "EvaluationConfig", "EvaluationReport", "ExactMatchMetric", "JudgeRubric", "Metric",
    "MetricDependencyError", "RLEvaluator", "RougeMetric", "TRAJECTORY_METRICS", "Tau2Result", "TrajectoryEvaluator",
    "aggregate_seeds", "compare_reports", "evaluate_model", "run_tau2",
]
