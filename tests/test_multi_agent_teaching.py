"""Multi-agent training teaches or fails loudly (issue 12): equal rewards raise, the default judges rank a parrot last."""
from __future__ import annotations

import pytest

from agenttune_lib.events import Event, EventKind, EventLog

TASK = "What notice period applies when either party terminates the agreement?"


def _episode(text: str) -> EventLog:
    return EventLog([Event(EventKind.OBSERVATION, {"content": TASK}), Event(EventKind.TEXT, {"content": text})], metadata={"task": TASK})


def test_copy_penalized_overlap_scores_a_parrot_below_a_real_answer():
    from agenttune_lib.multi_agent.judges import OverlapJudge

    parrot, good, off = _episode(TASK), _episode("Thirty days written notice is required before either party terminates."), _episode("Bananas are yellow.")
    plain = OverlapJudge("task")
    assert plain.evaluate_trajectory(parrot) > plain.evaluate_trajectory(good)  # the old default rewarded parroting most
    judge = OverlapJudge("task", penalize_copy=True)
    assert judge.evaluate_trajectory(parrot) == 0.0
    assert judge.evaluate_trajectory(good) > 0.0 == judge.evaluate_trajectory(off)


def test_default_spec_judges_penalize_copying():
    from agenttune_lib.multi_agent.spec import default_spec_path, load_graph_spec

    spec = load_graph_spec(default_spec_path())
    overlap = [j for j in spec.judges if j.kind == "overlap"]
    assert overlap and all(j.penalize_copy for j in overlap)


def test_a_step_with_all_rewards_equal_fails_loudly():
    from agenttune_lib.multi_agent.train import ZeroVarianceRewards, require_reward_variance

    constant = require_reward_variance(lambda completions, **kw: [0.0] * len(completions))
    with pytest.raises(ZeroVarianceRewards, match="every reward in this GRPO step is 0.0"):
        constant(["a", "b", "c", "d"])
    varying = require_reward_variance(lambda completions, **kw: [float(len(c)) for c in completions])
    assert varying(["a", "bb"]) == [1.0, 2.0]
