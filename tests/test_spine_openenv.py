"""OpenEnvHarness over a fake environment with reset()/step(action)."""
from __future__ import annotations

import pytest

from agenttune_lib.events import EventKind
from agenttune_lib.spine import ReActStrategy, run_conformance, run_episode
from agenttune_lib.spine.openenv import OpenEnvHarness
from _spine_helpers import Scripted, call


class CounterEnv:
    """A test fake: a counter that is done at 3, with one tool."""

    def reset(self, task=None):
        self.n = 0
        return {"observation": "ready"}

    def list_tools(self):
        return [{"type": "function", "function": {"name": "inc", "description": "Increment.", "parameters": {"type": "object", "properties": {}}}}]

    def step(self, action):
        if action["name"] != "inc":
            return {"observation": {"error": f"no tool {action['name']}"}, "reward": 0.0, "done": False}
        if self.n < 0:
            raise ConnectionError("sandbox gone")
        self.n += 1
        return ({"count": self.n}, 1.0 if self.n == 3 else 0.0, self.n == 3, {})


def test_episode_ends_when_the_environment_says_done():
    env = CounterEnv()
    harness = OpenEnvHarness(env)
    assert [t["function"]["name"] for t in harness.action_space()] == ["inc"]
    log = run_episode(ReActStrategy(Scripted([call("inc")]), max_steps=10), harness, "count to three")
    assert len(log.filter(EventKind.TOOL_CALL)) == 3
    assert log.rewards("episode") == [1.0] and log[-1].kind is EventKind.TURN_COMPLETE


def test_environment_errors_are_structured():
    env = CounterEnv()
    harness = OpenEnvHarness(env)
    harness.reset("t")
    assert harness.step({"name": "nope"}).error["type"] == "tool_error"
    env.n = -5
    assert harness.step({"name": "inc"}).error["type"] == "environment_error"


def test_no_snapshot_claimed_and_conformance_agrees():
    report = run_conformance(OpenEnvHarness(CounterEnv()))
    assert report.passed and report.checks["snapshot_declared"]
    with pytest.raises(TypeError, match="reset"):
        OpenEnvHarness(object())


def test_openenv_fingerprint_follows_the_environment_state():
    import dataclasses

    @dataclasses.dataclass
    class State:
        step_count: int = 0

    class StatefulEnv(CounterEnv):
        @property
        def state(self):
            return State(self.n)

    harness = OpenEnvHarness(StatefulEnv())
    harness.reset("t")
    before = harness.state_fingerprint()
    harness.step({"name": "inc", "arguments": {}})
    assert harness.state_fingerprint() != before
    with pytest.raises(NotImplementedError, match="no state"):
        OpenEnvHarness(CounterEnv()).state_fingerprint()
