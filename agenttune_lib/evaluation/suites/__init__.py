"""Held-out evaluation suites (QA validation, τ² test, BFCL strict/platform), each returning per-item rows for paired comparison."""
from agenttune_lib.evaluation.suites.bfcl import BFCLSuiteConfig, run_bfcl_suite
from agenttune_lib.evaluation.suites.common import SuiteResult
from agenttune_lib.evaluation.suites.qa import QASuiteConfig, run_qa_suite
from agenttune_lib.evaluation.suites.tau2 import Tau2SuiteConfig, run_tau2_suite, select_tau2_tasks

__all__ = ["BFCLSuiteConfig", "QASuiteConfig", "SuiteResult", "Tau2SuiteConfig", "run_bfcl_suite", "run_qa_suite", "run_tau2_suite", "select_tau2_tasks"]
