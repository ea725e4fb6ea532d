"""Harness contract, conformance (including a lying harness), and the τ² retail harness."""
from __future__ import annotations

import pytest

from agenttune_lib.events import EventKind
from agenttune_lib.spine import (
    Action,
    DictToolHarness,
    HarnessCapabilities,
    MemoryReActStrategy,
    PlanExecuteStrategy,
    ReActStrategy,
    ReflexionStrategy,
    Tau2RetailHarness,
    TreeOfThoughtsStrategy,
    load_tau2_tasks,
    run_conformance,
    run_episode,
    run_reflexion,
)
from agenttune_lib.spine.memory import InContextMemory
from agenttune_lib.spine.tau2 import Tau2Task, db_hash, fresh_db, replay_actions, tau2_tool_schemas
from _spine_helpers import ByRule, Scripted, call


def counter_harness(**kw):
    state = {"n": 0}

    def bump(by: int = 1) -> int:
        """Increase the counter."""
        state["n"] += by
        return state["n"]

    return DictToolHarness({"bump": bump}, state=state, **kw)


def test_dict_harness_conformance_passes():
    report = run_conformance(counter_harness(max_steps=5), probe=Action.call("bump", {"by": 2}))
    assert report.passed, report.drift
    assert report.checks["snapshot_restore"] and report.checks["max_steps"]


class LyingHarness(DictToolHarness):
    """Claims snapshots but restore() does nothing."""

    def restore(self, blob):
        pass


class HalfLyingHarness(DictToolHarness):
    """Restores the log but not the environment."""

    def _set_env_state(self, state):
        pass


def test_conformance_catches_a_lying_harness():
    report = run_conformance(LyingHarness({"x": lambda: 1}))
    assert not report.passed
    assert any("did not revert the event log" in d for d in report.drift)
    half = run_conformance(_half(), probe=Action.call("bump", {"by": 1}))
    assert not half.passed and any("environment state" in d for d in half.drift)
    # Without a caller's probe the check still reaches the environment (it perturbs the state itself).
    unprobed = run_conformance(_half())
    assert not unprobed.passed and any("did not revert the environment state" in d for d in unprobed.drift)
    assert unprobed.checks["env_state_restored"] is False


def test_every_shipped_snapshot_harness_exposes_a_restorable_state_fingerprint():
    for harness in (counter_harness(max_steps=3), Tau2RetailHarness(max_steps=3)):
        report = run_conformance(harness)
        assert report.passed, report.drift
        assert report.checks["env_state_restored"] is True
        harness.reset(harness.default_task() if hasattr(harness, "default_task") else "t")
        before = harness.state_fingerprint()
        blob = harness.snapshot()
        assert harness._perturb_env() and harness.state_fingerprint() != before
        harness.restore(blob)
        assert harness.state_fingerprint() == before


def test_a_snapshot_harness_without_a_fingerprint_is_drift():
    from agenttune_lib.spine import Harness

    class NoPrint(Harness):
        capabilities = HarnessCapabilities(supports_snapshot=True)

        def action_space(self):
            return []

        def _reset_env(self, task):
            pass

        def _execute(self, name, arguments):
            from agenttune_lib.tools.base import ToolResult

            return ToolResult(name, "ok")

    report = run_conformance(NoPrint(max_steps=None))
    assert not report.passed and any("no environment state fingerprint" in d for d in report.drift)


def _half():
    state = {"n": 0}

    def bump(by: int = 1) -> int:
        """Increase the counter."""
        state["n"] += by
        return state["n"]

    return HalfLyingHarness({"bump": bump}, state=state)


def test_conformance_catches_wrong_max_steps_and_undeclared_snapshot():
    class Overclaims(DictToolHarness):
        capabilities = HarnessCapabilities(supports_snapshot=True, max_steps=2)

    h = Overclaims({"x": lambda: 1}, max_steps=4)
    h.capabilities = HarnessCapabilities(supports_snapshot=True, max_steps=2)
    report = run_conformance(h)
    assert any("max_steps=2" in d for d in report.drift)

    class Streams(DictToolHarness):
        pass

    s = Streams({"x": lambda: 1})
    s.capabilities = HarnessCapabilities(supports_snapshot=True, supports_streaming=True)
    assert any("supports_streaming" in d for d in run_conformance(s).drift)


def test_step_after_done_and_before_reset():
    h = counter_harness()
    with pytest.raises(RuntimeError, match="before reset"):
        h.step(Action.answer("x"))
    h.reset("t")
    assert h.step(Action.answer("x")).done
    assert h.step(Action.call("bump")).info == {"already_done": True}
    with pytest.raises(TypeError):
        h.step(42)  # type: ignore[arg-type]


# -- τ² retail --------------------------------------------------------------------

def test_tau2_tasks_dataset_split():
    train, test = load_tau2_tasks("train"), load_tau2_tasks("test")
    assert len(train) == 74 and len(test) == 40
    assert not {t.id for t in train} & {t.id for t in test}
    row = train[0].to_row()
    assert row["split"] == "train" and row["n_actions"] == len(train[0].actions) and "Yusuf Rossi" in row["prompt"]
    with pytest.raises(ValueError, match="unknown τ² split"):
        load_tau2_tasks("dev")
    with pytest.raises(KeyError, match="nope"):
        load_tau2_tasks("train", ids=["nope"])


def test_tau2_tool_schemas_are_the_sixteen_business_tools():
    names = {s["function"]["name"] for s in tau2_tool_schemas()}
    assert len(names) == 16 and "state_key" not in str(tau2_tool_schemas()) and "reset_state" not in names


def test_tau2_replaying_ground_truth_scores_one_and_nothing_scores_zero():
    task = load_tau2_tasks("train")[0]
    h = Tau2RetailHarness()
    actions = iter([call(a["name"], **a["arguments"]) for a in task.actions] + ["Exchange done."])
    log = run_episode(ReActStrategy(lambda m: next(actions), max_steps=20), h, task)
    assert log.rewards("episode") == [1.0]
    assert log.metadata["task_id"] == task.id and log.metadata["domain"] == "tau2_retail"
    empty = run_episode(ReActStrategy(Scripted(["I cannot help."])), h, task)
    assert empty.rewards("episode") == [0.0]


def test_tau2_tool_errors_are_structured():
    task = load_tau2_tasks("train")[1]
    h = Tau2RetailHarness()
    model = Scripted([call("get_order_details", order_id="#NOPE"), call("no_such_tool"), call("get_order_details"), "sorry"])
    log = run_episode(ReActStrategy(model), h, task)
    errors = [e.payload["error"] for e in log if e.is_error]
    assert [e["type"] for e in errors] == ["tool_error", "unknown_tool", "invalid_arguments"]
    assert "not found" in errors[0]["message"].lower()


def test_tau2_conformance_reverts_the_database():
    task = load_tau2_tasks("train")[0]
    report = run_conformance(Tau2RetailHarness(max_steps=3), task=task)
    assert report.passed, report.drift


def test_replay_is_deterministic():
    task = load_tau2_tasks("train")[2]
    assert db_hash(replay_actions(task.actions)) == db_hash(replay_actions(task.actions)) != db_hash(fresh_db()) or not task.actions


@pytest.mark.parametrize("kind", ["react", "plan", "reflexion", "memory", "tot"])
def test_all_five_strategies_run_on_tau2(kind):
    task: Tau2Task = load_tau2_tasks("train")[0]
    gt = [call(a["name"], **a["arguments"]) for a in task.actions]

    def rule(messages):
        if messages[0]["content"].startswith("You review"):
            return "Follow the steps."
        done = sum(1 for m in messages if m["role"] == "tool")
        return gt[done] if done < len(gt) else "All set."

    h = Tau2RetailHarness(max_steps=12)
    model = ByRule(rule)
    if kind == "react":
        log = run_episode(ReActStrategy(model, max_steps=12), h, task)
    elif kind == "plan":
        plan = "\n".join(gt)
        log = run_episode(PlanExecuteStrategy(Scripted([plan, "All set."]), max_steps=12), h, task)
    elif kind == "reflexion":
        log = run_reflexion(ReflexionStrategy(model, max_attempts=2, max_steps=12), h, task)
    elif kind == "memory":
        log = run_episode(MemoryReActStrategy(model, InContextMemory(), max_steps=12), h, task)
    else:
        log = run_episode(TreeOfThoughtsStrategy(model, n_candidates=2, max_steps=12), h, task)
    assert log.rewards("episode") == [1.0], kind
    assert len(log.filter(EventKind.TOOL_CALL)) == len(task.actions)


def test_step_accepts_mappings_toolcalls_and_text():
    from agenttune_lib.tools.parsing import ToolCall

    h = counter_harness()
    h.reset("t")
    assert h.step({"name": "bump", "arguments": {"by": 2}}).events[-1].payload["content"] == "2"
    assert h.step(ToolCall("bump", {"by": 1})).events[-1].payload["content"] == "3"
    assert h.step('<tool_call>{"name": "bump", "arguments": {}}</tool_call>').events[-1].payload["content"] == "4"
    assert h.step("<tool_call>{broken</tool_call>").error["type"] == "parse_error"
    with pytest.raises(ValueError, match="needs a 'name'"):
        h.step({"arguments": {}})


def test_tau2_conformance_default_task_and_dataset():
    from agenttune_lib.spine.tau2 import tau2_dataset

    assert run_conformance(Tau2RetailHarness(max_steps=2)).passed
    ds = tau2_dataset("test", limit=3)
    assert ds.num_rows == 3 and set(ds.column_names) >= {"task_id", "prompt", "actions", "split"}


def test_db_match_reward_without_a_harness():
    from agenttune_lib.spine.tau2 import db_match_reward
    from agenttune_lib.tools.parsing import parse_tool_calls

    task = load_tau2_tasks("train")[0]
    text = "".join(call(a["name"], **a["arguments"]) for a in task.actions)
    assert db_match_reward(task, parse_tool_calls(text).calls) == 1.0
    assert db_match_reward(task.id, task.actions[:-1]) == 0.0


def test_spine_cli():
    from typer.testing import CliRunner

    from agenttune_lib.cli.spine import app

    runner = CliRunner()
    listed = runner.invoke(app, ["tasks", "--split", "test", "--limit", "2"])
    assert listed.exit_code == 0 and "40 tasks" in listed.output
    conf = runner.invoke(app, ["conformance", "--harness", "dict"])
    assert conf.exit_code == 0 and '"passed": true' in conf.output
    bad = runner.invoke(app, ["tasks", "--split", "dev"])
    assert bad.exit_code != 0


def test_episode_problems_flags_malformed_logs():
    from agenttune_lib.events import Event, EventLog
    from agenttune_lib.spine.validate import episode_problems

    good = run_episode(ReActStrategy(Scripted([call("bump"), "done"])), counter_harness(), "t")
    assert episode_problems([good], require_full=False) == []
    broken = EventLog([Event(EventKind.TOOL_CALL, {"name": "x", "arguments": {}, "id": "c1"})])
    found = {p["problem"] for p in episode_problems([broken])}
    assert {"tier is 'light', expected 'full'", "does not open with the task OBSERVATION", "does not close with TURN_COMPLETE", "tool calls without a result: ['c1']"} <= found


def test_restore_refuses_a_tampered_or_foreign_snapshot():
    import pickle

    h = counter_harness()
    h.reset("t")
    blob = h.snapshot()
    evil = blob[:32] + pickle.dumps({"events": []})  # right length, wrong seal
    with pytest.raises(ValueError, match="did not produce"):
        h.restore(evil)
    with pytest.raises(ValueError, match="did not produce"):
        counter_harness().restore(blob)  # another instance's snapshot
    h.step(Action.call("bump"))
    h.restore(blob)
    assert h.state == {"n": 0} and len(h.events) == 1  # its own snapshot restores
