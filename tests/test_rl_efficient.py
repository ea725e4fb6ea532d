"""Efficient GRPO pieces: the pre-rollout filter's skip window and max-variance down-sampling."""
from __future__ import annotations

import itertools
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from agenttune_lib.rl.efficient import EfficiencyConfig, PreRolloutFilter, max_variance_indices

import pytest


def test_filter_skips_after_k_all_correct_epochs_and_readmits_after_window():
    f = PreRolloutFilter(k=2, skip_window=1, correct_threshold=1.0)
    assert not f.should_skip("p")
    f.record("p", [1.0, 1.0])
    assert not f.should_skip("p")  # only one all-correct epoch so far
    f.record("p", [1.0, 1.0])
    assert f.should_skip("p")  # two in a row: skip
    assert not f.should_skip("p")  # window over: back in the pool
    f.record("p", [1.0, 0.0])  # the policy moved: informative again
    assert not f.should_skip("p")


def test_filter_default_k1():
    f = PreRolloutFilter()
    f.record("a", [1.0, 1.0, 1.0])
    f.record("b", [0.0, 1.0, 1.0])
    assert f.should_skip("a") and not f.should_skip("b")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=8), st.integers(2, 8))
def test_max_variance_is_optimal(rewards, m):
    m = min(m, len(rewards))
    pick = max_variance_indices(rewards, m)
    assert len(pick) == m == len(set(pick))
    best = max(statistics.pvariance([rewards[i] for i in c]) for c in itertools.combinations(range(len(rewards)), m))
    assert statistics.pvariance([rewards[i] for i in pick]) == pytest.approx(best, abs=1e-9)


def test_config_validation():
    with pytest.raises(ValueError, match="keep_rollouts"):
        EfficiencyConfig(keep_rollouts=1)
    with pytest.raises(ValueError, match="k must"):
        EfficiencyConfig(k=0)
