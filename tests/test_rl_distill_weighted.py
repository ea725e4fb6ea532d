"""Distillation learns only from success, and Table 3's per-token weights reach the loss (issue 12)."""
from __future__ import annotations

import pytest

from agenttune_lib.events import Event, EventKind, EventLog


def _log(tok, reward: float | None, answer: str = "4", stage: str | None = None, **meta):
    from agenttune_lib.rl.rollout import episode_to_eventlog

    segs = [
        {"kind": "tool_call", "payload": {"name": "calculator", "arguments": {"expression": "2+2"}}},
        {"kind": "tool_result", "payload": {"name": "calculator", "content": "4"}},
        {"kind": "text", "payload": {"content": answer}},
    ]
    log, _ = episode_to_eventlog(tok, None, "What is 2+2?", segs, metadata={"answer": "4", **meta})
    events = list(log.events)
    if reward is not None:
        events.append(Event(EventKind.REWARD, {"value": reward}, scope="episode"))
    metadata = dict(log.metadata)
    if stage:
        metadata["lifecycle_stage"] = stage
    return EventLog(events, tier="full", id=log.id, metadata=metadata, token_ids=log.token_ids)


def test_weight_two_token_contributes_exactly_twice_the_gradient(tiny_model):
    import torch

    from agenttune_lib.rl.weighted_sft import weighted_token_loss

    model, _ = tiny_model
    torch.manual_seed(0)
    ids = torch.randint(5, 200, (1, 12))
    a, b = 5, 9  # two target positions

    def grads(weights):
        model.zero_grad()
        labels = ids.clone()
        w = torch.zeros_like(ids, dtype=torch.float32)
        for pos, value in weights.items():
            w[0, pos] = value
        labels[w == 0] = -100
        logits = model(input_ids=ids).logits
        weighted_token_loss(logits, labels, w).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone()

    g_a, g_b = grads({a: 1.0}), grads({b: 1.0})  # each alone: that token's NLL gradient
    g_mix = grads({a: 1.0, b: 2.0})  # weighted mean: (1*nll_a + 2*nll_b) / 3
    assert torch.allclose(g_mix * 3.0, g_a + 2.0 * g_b, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(g_mix * 2.0, g_a + g_b, atol=1e-5, rtol=1e-4)  # unweighted mean would differ


def test_trainer_loss_is_the_weighted_loss(tiny_model):
    import torch

    from agenttune_lib.rl.distill import distill
    from agenttune_lib.rl.weighted_sft import weighted_token_loss

    model, tok = tiny_model
    trainer = distill(model, tok, [_log(tok, 1.0), _log(tok, 1.0)], lora=True, max_length=128, max_steps=1, per_device_train_batch_size=2, disable_tqdm=True)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    assert set(batch) >= {"input_ids", "labels", "token_weights"}
    w = batch["token_weights"]
    assert {float(x) for x in w.unique()} <= {0.0, 1.0, 2.0} and (w == 2.0).any() and (w == 1.0).any()
    assert ((batch["labels"] == -100) == (w == 0)).all()
    expected = weighted_token_loss(trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"], w)
    got = trainer.compute_loss(trainer.model, dict(batch))
    assert torch.allclose(got, expected)
    trainer.train()
    assert trainer.state.log_history and "loss" in trainer.state.log_history[0]


def test_no_training_path_consumes_a_failed_episode_by_default(tiny_model):
    from agenttune_lib.rl.distill import NotEnoughEpisodes, distill, filter_teacher_trajectories

    model, tok = tiny_model
    good, failed, evaluation = _log(tok, 1.0), _log(tok, 0.0, answer="4"), _log(tok, 1.0, stage="evaluate")
    report = filter_teacher_trajectories([good, failed, evaluation])
    assert [log.id for log in report.kept] == [good.id]
    assert report.dropped == {failed.id: "below_success_threshold", evaluation.id: "evaluation_log"}
    # held-out evaluation logs only when asked for by name
    assert evaluation.id in {l.id for l in filter_teacher_trajectories([evaluation], include_stages=("evaluate",)).kept}
    trainer = distill(model, tok, [good, failed, evaluation], max_length=128, max_steps=1, disable_tqdm=True)
    assert trainer.agenttune_trajectory_ids == [good.id] and len(trainer.train_dataset) == 1
    with pytest.raises(NotEnoughEpisodes, match=r"at least 2 successful teacher episodes, 1 survived"):
        distill(model, tok, [good, failed], min_episodes=2, max_length=128, max_steps=1)
    with pytest.raises(NotEnoughEpisodes, match="0 survived"):
        distill(model, tok, [failed], max_length=128, max_steps=1)


def test_train_adapter_distill_drops_failed_episodes(tiny_model, tmp_path):
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl.distill import NotEnoughEpisodes
    from agenttune_lib.rl.train import TrainConfig, train_adapter

    model, tok = tiny_model
    path = save_tiny_model(tmp_path / "tiny")
    good, failed = _log(tok, 1.0), _log(tok, 0.0)
    result = train_adapter(TrainConfig(algorithm="distill", max_steps=1, max_length=128), path, [good, failed], tmp_path / "out")
    assert result.trajectory_ids == [good.id] and result.filter_counts["below_success_threshold"] == 1
    with pytest.raises(NotEnoughEpisodes):
        train_adapter(TrainConfig(algorithm="distill", max_steps=1, max_length=128, min_episodes=2), path, [good, failed], tmp_path / "out2")


@pytest.mark.parametrize("loss", ["answer_only", "unmasked", "masked", "weighted"])
def test_loss_modes_weight_the_right_tokens(tiny_model, loss):
    from agenttune_lib.rl.distill import weighted_token_rows

    _, tok = tiny_model
    log = _log(tok, 1.0)
    row = weighted_token_rows([log], tok, loss=loss)[0]
    w = row["token_weights"]
    if loss == "unmasked":
        assert set(w) == {1.0}
    elif loss == "weighted":
        assert set(w) == {0.0, 1.0, 2.0}
    elif loss == "masked":
        assert set(w) == {0.0, 1.0} and sum(w) == sum(1 for x in weighted_token_rows([log], tok, loss="weighted")[0]["token_weights"] if x > 0)
    else:  # answer-only: only the final answer carries loss, no tool call in the row
        assert set(w) == {0.0, 1.0} and "tool_call" not in tok.decode(row["input_ids"])


def test_project_evaluate_logs_never_feed_train_or_distill_unless_named():
    from agenttune_lib.spine.harness import DictToolHarness
    from agenttune_lib.spine.project import Project
    from agenttune_lib.spine.strategies import ReActStrategy

    project = Project(ReActStrategy(lambda messages: "4"), DictToolHarness({}))
    train_log = project.infer({"prompt": "2+2?", "answer": "4"})
    failed = project.infer({"prompt": "1+1?", "answer": "2"})  # the model says 4: reward 0
    assert failed.rewards("episode") == [0.0]
    held_out = project.evaluate([{"prompt": "3+1?", "answer": "4"}])
    assert held_out["success_rate"] == 1.0
    for full in project.trajectories:  # as if collected with token ids
        full.tier = "full"
    seen: list = []

    def factory(rows, model):
        seen.append([r["id"] for r in rows])
        return type("T", (), {"train": lambda self: None})()

    project.train(trainer_factory=factory)
    project.distill(None, trainer_factory=factory)
    assert seen == [[train_log.id], [train_log.id]]
    project.train(trainer_factory=factory, include_stages=("evaluate",))
    assert set(seen[-1]) == {train_log.id, *held_out["trajectory_ids"]}
