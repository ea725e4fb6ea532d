"""A bad closed-loop setting is refused when the resource is built, naming the setting, before any step runs."""
from __future__ import annotations

import dagster as dg
import pytest

from agenttune_assets.defs.resources import ClosedLoopResource
from agenttune_lib.closed_loop import GateConfig


@pytest.mark.parametrize("setting, value, message", [
    ("gate_replay_workers", 0, "closed_loop.gate_replay_workers must be an integer >= 1, got 0"),
    ("gate_holdout_size", -3, "closed_loop.gate_holdout_size must be an integer >= 0, got -3"),
    ("gate_min_fix_rate", 1.5, r"closed_loop.gate_min_fix_rate must be a number in \[0, 1\], got 1.5"),
    ("gate_noninferiority_margin", -0.1, r"closed_loop.gate_noninferiority_margin must be a number in \[0, 1\]"),
    ("gate_guards", ["bfcl_platform"], "gate criterion 'bfcl_platform' is not 'suite/metric'"),
    ("gate_targets", {"distill": ["qa/valid_call@x"]}, "the margin after '@' is not a number"),
    ("classifier", "gpt", "closed_loop.classifier must be 'rules' or 'llm', got 'gpt'"),
    ("corrector", "copy", "closed_loop.corrector must be 'served', 'llm' or 'reference'"),
    ("dominance_ratio", 0.0, r"dominance_ratio must be in \(0, 1\]"),
    ("capacity", 0, "closed_loop.capacity must be an integer >= 1"),
])
def test_bad_setting_is_refused_at_construction(setting, value, message):
    with pytest.raises(ValueError, match=message):
        ClosedLoopResource(**{setting: value})


def test_defaults_build_and_zero_holdout_is_allowed():
    assert ClosedLoopResource().gate_config().replay_workers == 2
    assert ClosedLoopResource(gate_holdout_size=0).gate_config().holdout_size == 0  # no held-out replay: a served-only gate


@pytest.mark.parametrize("field, bad", [("holdout_size", -1), ("min_cases", True), ("replay_workers", 0), ("min_fix_rate", -0.01), ("max_source_share", 2.0),
                                         ("noninferiority_margin", float("nan"))])
def test_gate_config_refuses_out_of_range(field, bad):
    with pytest.raises(ValueError, match=f"GateConfig.{field}"):
        GateConfig(**{field: bad})


def test_bad_run_config_fails_the_run_before_its_first_step_body(tmp_path):
    """Through Dagster run config, as a user sets it in the launchpad: the run fails at resource init; the asset never runs."""
    ran = []

    @dg.asset
    def uses_loop(closed_loop: ClosedLoopResource) -> None:
        ran.append(closed_loop.gate_replay_workers)

    result = dg.materialize([uses_loop], resources={"closed_loop": ClosedLoopResource()}, raise_on_error=False,
                            run_config={"resources": {"closed_loop": {"config": {"gate_replay_workers": 0}}}})
    assert not result.success and ran == []
    failure = next(e for e in result.all_events if e.is_failure)
    assert "closed_loop.gate_replay_workers must be an integer >= 1" in str(failure.event_specific_data)
