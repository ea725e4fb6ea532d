"""Paired comparison: scipy bootstrap interval, statsmodels MDE, per-item warehouse rows, config-mismatch refusal."""
import numpy as np
import pytest

from agenttune_lib.evaluation.paired import ConfigMismatchError, paired_comparison
from agenttune_lib.evaluation.store import compare_items, latest_comparisons, load_items, write_comparisons, write_items


def test_interval_excludes_zero_for_a_real_gain_and_includes_it_for_identical_scores():
    rng = np.random.default_rng(3)
    base = (rng.random(80) < 0.3).astype(float)
    better = np.maximum(base, rng.random(80) < 0.5).astype(float)
    up = paired_comparison(base, better, metric="success")
    assert up.diff > 0 and up.ci_low > 0 and up.excludes_zero
    same = paired_comparison(base, base)
    assert same.diff == 0 and same.ci_low <= 0 <= same.ci_high and not same.excludes_zero
    # identical outputs have no spread in their differences: the MDE falls back to the unpaired spread, never to 0
    assert same.sd_source == "unpaired" and same.mde > 0


def test_noisy_equal_models_include_zero_and_mde_shrinks_with_n():
    rng = np.random.default_rng(0)
    a, b = (rng.random(60) < 0.5).astype(float), (rng.random(60) < 0.5).astype(float)
    res = paired_comparison(a, b)
    assert res.ci_low < res.diff < res.ci_high
    small = paired_comparison(a[:20], b[:20])
    assert small.mde > res.mde
    # the n that detects a 5-point gain at this spread is far beyond 60 items
    assert res.n_required is not None and res.n_required > 60


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="same items"):
        paired_comparison([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="at least 2"):
        paired_comparison([1], [0])
    with pytest.raises(ValueError, match=r"base_scores\[1\] is None"):
        paired_comparison([1, None], [0, 1])


def _rows(scores, excluded=()):
    return [{"item_id": f"i{i}", "category": "c", "output": "o", "score": s, "success": bool(s), "excluded": i in excluded,
             "error_type": "", "metrics": {"recall": s / 2}} for i, s in enumerate(scores)]


def test_items_and_comparisons_round_trip_the_warehouse(warehouse):
    base, cand = [0.0] * 30, [1.0] * 20 + [0.0] * 10
    write_items(warehouse, "r1", "qa", "base", "base:m", _rows(base, excluded={0}), "h1")
    write_items(warehouse, "r1", "qa", "candidate", "ad1", _rows(cand, excluded={0}), "h1")
    b, c = load_items(warehouse, "r1", "qa", "base"), load_items(warehouse, "r1", "qa", "candidate")
    assert len(b) == 30 and b[0]["metrics"] == {"recall": 0.0}
    comps = compare_items(b, c, metrics=("score", "recall"))
    score = next(x for x in comps if x.metric == "score")
    assert score.n == 29  # the excluded item is left out
    assert score.diff == pytest.approx(19 / 29) and score.excludes_zero
    write_comparisons(warehouse, "r1", "qa", comps, "h1", "ad1", "base:m")
    rows = latest_comparisons(warehouse, "ad1")
    assert {r["metric"] for r in rows} == {"score", "recall"} and rows[0]["config_hash"] == "h1"
    assert {r["metric"]: r["headline"] for r in rows} == {"score": True, "recall": False}
    assert latest_comparisons(warehouse, "other") == []


def test_comparing_rows_from_different_configs_raises(warehouse):
    write_items(warehouse, "r1", "qa", "base", "base:m", _rows([0.0, 1.0, 0.0]), "h1")
    write_items(warehouse, "r2", "qa", "candidate", "ad1", _rows([1.0, 1.0, 0.0]), "h2")
    with pytest.raises(ConfigMismatchError, match="h1.*h2"):
        compare_items(load_items(warehouse, "r1", "qa", "base"), load_items(warehouse, "r2", "qa", "candidate"))


def test_latest_category_scores_show_each_models_newest_bfcl_run(warehouse):
    from agenttune_lib.evaluation.store import latest_category_scores

    rows = [{"item_id": f"e{i}", "category": cat, "score": s, "success": bool(s)} for i, (cat, s) in enumerate([("simple_python", 1.0), ("simple_python", 0.0), ("irrelevance", 1.0)])]
    write_items(warehouse, "old", "bfcl_strict", "base", "base:m", [{**r, "score": 0.0} for r in rows], "h0")
    write_items(warehouse, "new", "bfcl_strict", "base", "base:m", rows, "h1")
    got = latest_category_scores(warehouse, ["base:m", "nobody"])
    assert [(r["category"], r["mean"], r["n"], r["report_id"]) for r in got] == [("irrelevance", 1.0, 1, "new"), ("simple_python", 0.5, 2, "new")]
