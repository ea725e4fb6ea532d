"""Calibration on the Berkeley Function Calling Leaderboard (v4 data from the bfcl-eval package)."""
from agenttune_lib.evaluation.bfcl.checker import CheckResult, check_ast, check_entry_output, ground_truth_calls
from agenttune_lib.evaluation.bfcl.data import AST_CATEGORIES, RELEVANCE_CATEGORIES, SINGLE_TURN_CATEGORIES, BFCLEntry, load_bfcl
from agenttune_lib.evaluation.bfcl.decode import BFCLDecodeError, decode_calls, render_python_calls
from agenttune_lib.evaluation.bfcl.runner import BFCLResult, run_bfcl, score_outputs

__all__ = [
    "AST_CATEGORIES", "RELEVANCE_CATEGORIES", "SINGLE_TURN_CATEGORIES", "BFCLDecodeError", "BFCLEntry", "BFCLResult",
    "CheckResult", "check_ast", "check_entry_output", "decode_calls", "ground_truth_calls", "load_bfcl", "render_python_calls", "run_bfcl",
    "score_outputs",
]
