"""The Project lifecycle: collection into the warehouse with provenance, evaluation, training via trainer_factory, heal."""
from __future__ import annotations

import pytest

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.models.generate import ChatGenerator
from agenttune_lib.models.tiny import build_tiny_model
from agenttune_lib.spine import DictToolHarness, ReActStrategy, load_tau2_tasks
from agenttune_lib.spine.project import LifecycleEvent, Project, engine_model
from agenttune_lib.spine.tau2 import Tau2RetailHarness
from agenttune_lib.warehouse import Warehouse
from _spine_helpers import Scripted, call


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class OneStepTrainer:
    """A real (tiny) SFT step over token rows: weighted next-token loss, one optimizer step."""

    def __init__(self, rows, model):
        self.rows, self.model = rows, model

    def train(self):
        import torch

        opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        row = self.rows[0]
        ids = torch.tensor([row["input_ids"]])
        weights = torch.tensor(row["token_weights"][1:], dtype=torch.float32)
        logits = self.model(ids).logits[0, :-1]
        per_tok = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
        loss = (per_tok * weights).sum() / weights.sum().clamp(min=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return {"loss": float(loss.detach()), "rows": len(self.rows), "weighted_tokens": int((weights > 0).sum())}


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model()


def test_collect_lands_in_warehouse_with_provenance(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    seen: list[LifecycleEvent] = []
    model = Scripted([call("add", a=2, b=3), "5"])
    project = Project(ReActStrategy(model), DictToolHarness({"add": add}), warehouse=wh, run_id="run-1", model_version="scripted", listeners=[seen.append])
    logs = project.collect([{"prompt": "2+3?", "answer": "5"}])
    assert [e.stage for e in seen] == ["collect"] and seen[0].details["success_rate"] == 1.0
    stored = wh.get_log(logs[0].id)
    assert stored == logs[0]
    row = wh.execute("SELECT run_id, model_version FROM trajectories WHERE id = ?", [logs[0].id])[0]
    assert row == ("run-1", "scripted")
    report = project.evaluate([{"prompt": "2+3?", "answer": "5"}])
    assert report["success_rate"] == 1.0 and report["n"] == 1
    assert len(wh.read_logs()) == 2


def test_collect_rollout_text_only_and_agentic_with_a_real_engine(tiny, tmp_path):
    model, tok = tiny
    engine = ChatGenerator(model, tok, max_new_tokens=8)
    wh = Warehouse(tmp_path / "w.duckdb")
    project = Project(warehouse=wh)
    text_logs = project.collect_rollout(engine, ["Say hi."])
    assert text_logs[0].tier == "full" and text_logs[0].token_ids
    assert [e.kind for e in text_logs[0]][:2] == [EventKind.OBSERVATION, EventKind.TEXT]
    agentic = project.collect_rollout(engine, [{"prompt": "2+3?", "answer": "5"}], tools={"add": add}, max_steps=2)
    assert agentic[0].metadata["agentic"] is True and agentic[0].tier == "full"
    assert project.events[-1].stage == "collect_rollout" and project.events[-1].details["tiers"] == ["full"]
    assert {l.id for l in wh.read_logs()} == {text_logs[0].id, agentic[0].id}


def test_engine_protocols():
    class GenEngine:
        def generate(self, messages):
            return {"text": "hi", "prompt_ids": [1], "completion_ids": [2, 3], "logprobs": [-0.1, -0.2]}

    class RolloutEngine:
        def rollout(self, prompts):
            return ["hello" for _ in prompts]

    assert engine_model(GenEngine())([]).completion_ids == [2, 3]
    assert engine_model(RolloutEngine())([]) == "hello"
    with pytest.raises(TypeError, match="not an engine"):
        engine_model(42)


def test_train_and_distill_through_trainer_factory(tiny):
    model, tok = tiny
    engine = ChatGenerator(model, tok, max_new_tokens=6)
    project = Project()
    logs = project.collect_rollout(engine, ["Say hi."])
    before = [p.detach().clone() for p in model.parameters()]
    result = project.train(fmt="sft", trainer_factory=OneStepTrainer, model=model, tokenizer=tok)
    assert result["rows"] == 1 and result["weighted_tokens"] > 0
    assert any((p - b).abs().sum() > 0 for p, b in zip(model.parameters(), before))
    assert project.events[-1].stage == "train"
    rows_seen = []
    project.train(trainer_factory=lambda rows, m: rows_seen.extend(rows) or type("T", (), {"train": lambda self: None})())
    assert [m["role"] for m in rows_seen[0]["messages"]][:2] == ["system", "user"] and "segment_weights" in rows_seen[0]
    # distillation keeps only successful, error-free teacher trajectories
    good = EventLog([Event(EventKind.OBSERVATION, {"content": "q"}), Event(EventKind.TEXT, {"content": "a"}), Event(EventKind.REWARD, {"value": 1.0}, scope="episode")], tier="full")
    bad = EventLog([Event(EventKind.OBSERVATION, {"content": "q"}), Event(EventKind.TEXT, {"content": "b"}), Event(EventKind.REWARD, {"value": 0.0}, scope="episode")], tier="full")
    kept = []
    project.distill(model, trainer_factory=lambda rows, student: kept.extend(rows) or type("T", (), {"train": lambda self: "ok"})(), teacher_logs=[good, bad])
    assert [r["id"] for r in kept] == [good.id] and project.events[-1].details["filtered_out"] == 1
    with pytest.raises(ValueError, match="none of 1 teacher"):
        project.distill(model, trainer_factory=OneStepTrainer, teacher_logs=[bad])
    with pytest.raises(ValueError, match="no full-tier"):
        project.train(trainer_factory=OneStepTrainer, logs=[EventLog([Event(EventKind.TEXT, {"content": "x"})])])
    with pytest.raises(ValueError, match="trainer_factory"):
        project.train()
    assert logs


def test_heal_hands_audit_records_to_a_detector():
    model = Scripted([call("nope"), call("nope"), "done"])
    project = Project(ReActStrategy(model), DictToolHarness({"add": add}))
    project.collect(["anything"])
    got = {}

    def detector(records):
        got.update(records)
        return [tid for tid, recs in records.items() if any(r["status"] == "error" for r in recs)]

    report = project.heal(detector=detector)
    assert report["error_records"] == 2 and len(report["failures"]) == 1
    assert project.events[-1].stage == "heal"
    default = project.heal()  # the closed loop's FailureDetector
    assert default["failures"] and "tool_crash" in default["failures"][0].signals


def test_project_on_tau2_scripted():
    task = load_tau2_tasks("train")[0]
    gt = iter([call(a["name"], **a["arguments"]) for a in task.actions] + ["Done."])
    project = Project(ReActStrategy(lambda m: next(gt), max_steps=10), Tau2RetailHarness())
    log = project.infer(task)
    assert log.rewards("episode") == [1.0] and project.events[0].details["reward"] == [1.0]


def test_stop_criterion_fires_on_the_closing_tag(tiny):
    import torch

    from agenttune_lib.models.generate import _stop_criteria

    _, tok = tiny
    prompt = tok("hello", add_special_tokens=False)["input_ids"]
    stop = _stop_criteria(tok, ["</tool_call>"], len(prompt))[0]
    done = tok('hello <tool_call>{"name": "a"}</tool_call>', add_special_tokens=False)["input_ids"]
    open_only = tok('hello <tool_call>{"name": "a"}', add_special_tokens=False)["input_ids"]
    assert bool(stop(torch.tensor([done]), None)[0]) and not bool(stop(torch.tensor([open_only]), None)[0])


def test_evaluate_agentic_surfaces_trajectory_metrics():
    model = Scripted([call("add", a=2, b=3), call("add", a=2, b=3), call("add", a=2, b=3), "5"])
    project = Project(ReActStrategy(model), DictToolHarness({"add": add}))
    project.collect([{"prompt": "2+3?", "answer": "5"}])
    report = project.evaluate_agentic()
    assert report["n"] == 1 and report["success_rate"] == 1.0
    assert report["mean"]["TAC"] == 1.0 and report["mean"]["LCF"] > 0
    assert project.events[-1].stage == "evaluate_agentic"


def test_rejected_branches_are_stored_as_their_own_trajectories(tmp_path):
    from agenttune_lib.spine import TreeOfThoughtsStrategy
    from agenttune_lib.spine.project import REJECTED_SOURCE

    wh = Warehouse(tmp_path / "w.duckdb")
    replies = iter([call("nope"), call("add", a=2, b=3), "5", "5"])
    project = Project(TreeOfThoughtsStrategy(lambda m: next(replies), n_candidates=2), DictToolHarness({"add": add}), warehouse=wh)
    [episode] = project.collect([{"prompt": "2+3?", "answer": "5"}])
    accepted = wh.read_logs(source="spine")
    rejected = wh.read_logs(source=REJECTED_SOURCE)
    assert [log.id for log in accepted] == [episode.id]
    assert len(rejected) == 1 and rejected[0].metadata["branch_of"] == episode.id
    assert rejected[0].filter("tool_call")[0].payload["name"] == "nope"
