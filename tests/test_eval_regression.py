"""Trajectory regression against the deployed model: stopping tool use fails; rows under different configs are refused."""
import pytest

from agenttune_lib.evaluation.paired import ConfigMismatchError
from agenttune_lib.evaluation.regression import trajectory_regression


def _rows(calls, tac=None, h="h1"):
    return [{"item_id": f"i{i}", "config_hash": h, "metrics": {"tool_calls": c, "TAC": tac if c else None, "LCF": 0.0}} for i, c in enumerate(calls)]


def test_candidate_that_stops_calling_tools_fails():
    out = trajectory_regression({"tau2": _rows([0, 0, 0])}, {"tau2": _rows([1, 2, 0], tac=1.0)})
    assert not out["passed"] and "no tool call" in out["reasons"][0]


def test_equal_tool_use_passes_and_a_tac_drop_fails():
    assert trajectory_regression({"qa": _rows([1, 1, 0], tac=1.0)}, {"qa": _rows([1, 1, 0], tac=1.0)})["passed"]
    out = trajectory_regression({"qa": _rows([1, 1, 0], tac=0.5)}, {"qa": _rows([1, 1, 0], tac=1.0)})
    assert not out["passed"] and "TAC fell" in out["reasons"][0]


def test_rows_under_different_configs_are_not_compared():
    with pytest.raises(ConfigMismatchError, match="not comparable"):
        trajectory_regression({"qa": _rows([1], h="h1")}, {"qa": _rows([1], h="h2")})
