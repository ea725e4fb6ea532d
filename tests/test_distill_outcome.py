"""Issue 27: training bounded by steps (the same adapter on any load), rows whose answer turn carries loss in the
default config, and expert episodes that teach an answer only when their searches retrieved it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agenttune_lib.events import Event, EventKind, EventLog


def _episode(tok, answer: str = "ninety days", tool_chars: int = 1400, hops: int = 3) -> EventLog:
    """A multi-hop search episode with long tool results, rewarded 1.0."""
    from agenttune_lib.rl.rollout import episode_to_eventlog

    segs = []
    for h in range(hops):
        segs.append({"kind": "tool_call", "payload": {"name": "search_corpus", "arguments": {"query": f"licence hop {h}"}}})
        body = (f"[{h}] Beta Licence clause {h}. " + "The Licensee shall keep records of every evaluation copy. " * 40)[:tool_chars]
        segs.append({"kind": "tool_result", "payload": {"name": "search_corpus", "content": body}})
    segs.append({"kind": "text", "payload": {"content": answer}})
    log, _ = episode_to_eventlog(tok, None, "Under the evaluation grant, how long until the licence ends?", segs, metadata={"answer": answer})
    events = [*log.events, Event(EventKind.REWARD, {"value": 1.0}, scope="episode")]
    return EventLog(events, tier="full", id=log.id, metadata=dict(log.metadata), token_ids=log.token_ids)


def _default_distill_config():
    from agenttune_assets.defs.assets.train import TrainedAdapterConfig

    return TrainedAdapterConfig().to_lib("distill", retrain=False, rollout_actors=0)


def _loss_texts(rows, tok) -> list[str]:
    """Per row, the decoded text of its loss-bearing tokens."""
    return [tok.decode([i for i, w in zip(r["input_ids"], r["token_weights"]) if w > 0]) for r in rows]


def test_the_answer_turn_carries_loss_in_the_default_rows(tiny_tokenizer):
    from agenttune_lib.rl.distill import weighted_token_rows

    cfg = _default_distill_config()
    assert cfg.rows_mode == "turns" and cfg.max_wall_s == 3600
    # 420 characters a result: ~300 tokens of the tiny tokenizer (~1.4 characters a token), what a 1,200-character
    # passage is under SmolLM2's (~4), so the episode (~1,050 tokens) exceeds max_length as real three-hop walks do
    log = _episode(tiny_tokenizer, tool_chars=420)
    stats: dict = {}
    rows = weighted_token_rows([log], tiny_tokenizer, loss=cfg.loss, max_length=cfg.max_length, max_tool_chars=cfg.max_tool_chars,
                               rows_mode=cfg.rows_mode, stats=stats)
    assert all(len(r["input_ids"]) <= cfg.max_length for r in rows)
    assert stats["turns"] == 4 and stats["turns_dropped"] == 0 and stats["per_turn_rows"] == 4  # too long for one row: a row per turn
    texts = _loss_texts(rows, tiny_tokenizer)
    assert "ninety days" in texts[-1].replace(" ", " ")
    # The old design (one row cut from the right at max_length) never puts the answer in a loss-bearing position.
    cut = weighted_token_rows([log], tiny_tokenizer, loss=cfg.loss, max_length=cfg.max_length, max_tool_chars=cfg.max_tool_chars,
                              rows_mode="truncate")
    assert len(cut) == 1 and "ninety" not in _loss_texts(cut, tiny_tokenizer)[0]


def test_answer_weight_multiplies_the_answer_after_a_search_and_leaves_calls_and_declines_alone(tiny_tokenizer):
    from agenttune_lib.rl.distill import turn_rows
    from agenttune_lib.rl.rollout import episode_to_eventlog
    from agenttune_lib.rl.train import TrainConfig

    search = _episode(tiny_tokenizer, tool_chars=420)  # ~1,050 tokens: a row per turn at 1,024
    decline, _ = episode_to_eventlog(tiny_tokenizer, None, "Capitalise this sentence for me.",
                                     [{"kind": "text", "payload": {"content": "No tool fits; here it is in capitals."}}])
    for log, answers in ((search, 1), (decline, 0)):
        for max_length in (None, 1024):  # one row for the episode; for the search episode, a row per turn
            plain, stats = turn_rows(log, tiny_tokenizer, max_length=max_length)
            heavy, _ = turn_rows(log, tiny_tokenizer, max_length=max_length, answer_weight=4.0)
            assert stats["evidence_answer_turns"] == answers and stats["answer_turns_dropped"] == 0
            assert len(plain) == (1 if max_length is None or not answers else stats["turns"])
            assert [r["input_ids"] for r in plain] == [r["input_ids"] for r in heavy]
            changed = {(round(a, 6), round(b, 6)) for p, h in zip(plain, heavy)
                       for a, b in zip(p["token_weights"], h["token_weights"]) if a != b}
            assert changed == ({(1.0, 4.0)} if answers else set()), (max_length, changed)  # answer 1 -> 4; calls keep 2
    with pytest.raises(ValueError, match="answer_weight"):
        TrainConfig(algorithm="distill", answer_weight=0)


def test_answer_turns_that_cannot_fit_are_counted_apart_from_tool_calls(tiny_tokenizer):
    """The answer turn has the longest context of an episode (every search before it), so it is the first to miss
    max_length; the row statistics say how many answers taught nothing instead of hiding them among the turns."""
    from agenttune_lib.rl.distill import turn_rows

    log = _episode(tiny_tokenizer, tool_chars=420)
    lengths = {}
    for max_length in (2048, 1024, 420):
        rows, stats = turn_rows(log, tiny_tokenizer, max_length=max_length)
        lengths[max_length] = (stats["answer_turns"], stats["answer_turns_dropped"], stats["turns_dropped"])
    assert lengths[2048] == (1, 0, 0) and lengths[1024] == (1, 0, 0)
    answers, answers_dropped, dropped = lengths[420]
    assert answers == 1 and answers_dropped == 1 and dropped > answers_dropped  # calls dropped too, counted apart


def test_an_answer_whose_newest_result_alone_is_too_long_is_taught_from_the_passage_it_quotes(tiny_tokenizer):
    """Compacting older results is not enough when the newest result alone fills max_length: that result is cut to
    the window sharing the most words with the turn, so the answer is still taught, beside the passage it comes from."""
    from agenttune_lib.events import Event
    from agenttune_lib.rl.distill import turn_rows
    from agenttune_lib.rl.rollout import episode_to_eventlog

    filler = "The Licensee shall keep records of every evaluation copy. "
    evidence = "“Defect” means any failure of the Software to meet the specifications."
    # A search result as the tool returns it: JSON, so the quoted term reads \u201cDefect\u201d in the row's text.
    result = json.dumps({"query": "defined terms", "results": [{"text": filler * 12 + evidence + " " + filler * 12}]})
    assert "\\u201cDefect\\u201d" in result
    segs = [{"kind": "tool_call", "payload": {"name": "search_corpus", "arguments": {"query": "defined terms"}}},
            {"kind": "tool_result", "payload": {"name": "search_corpus", "content": result}},
            {"kind": "text", "payload": {"content": "Defect"}}]
    log, _ = episode_to_eventlog(tiny_tokenizer, None, "Which defined term names a failure to meet the specifications?", segs)
    log = EventLog([*log.events, Event(EventKind.REWARD, {"value": 1.0}, scope="episode")], tier="full", id=log.id,
                   metadata=dict(log.metadata), token_ids=log.token_ids)
    whole, _ = turn_rows(log, tiny_tokenizer, max_length=None)
    max_length = len(whole[0]["input_ids"]) // 2  # one result is most of the episode: no older result to compact
    rows, stats = turn_rows(log, tiny_tokenizer, max_length=max_length)
    assert stats["answer_turns"] == 1 and stats["answer_turns_dropped"] == 0 and stats["focused"] == 1
    answer_row = rows[-1]
    assert len(answer_row["input_ids"]) <= max_length
    assert "Defect" in _loss_texts([answer_row], tiny_tokenizer)[0]
    context = tiny_tokenizer.decode([i for i, w in zip(answer_row["input_ids"], answer_row["token_weights"]) if w == 0])
    assert "Defect" in context  # the kept window holds the definition the answer names
    assert "characters]" in context  # the cut is marked, not silent


def _adapter_tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


@pytest.mark.timeout(600)
def test_training_is_bounded_by_steps_and_gives_the_same_adapter_under_a_cpu_hog(tmp_path, tiny_tokenizer):
    import torch

    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl.distill import TrainingWallClockExceeded
    from agenttune_lib.rl.train import TrainConfig, train_adapter

    base = save_tiny_model(tmp_path / "base")
    logs = [_episode(tiny_tokenizer, answer=f"{n} days", tool_chars=300, hops=2) for n in ("ninety", "thirty", "sixty", "ten")]
    cfg = TrainConfig(algorithm="distill", max_steps=5, batch_size=2, learning_rate=3e-3, max_length=256, seed=3)
    quiet = train_adapter(cfg, base, logs, tmp_path / "quiet")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loaded = train_adapter(cfg, base, logs, tmp_path / "loaded")
    finally:
        hog.kill()
        hog.wait()
    assert quiet.steps == loaded.steps == 5
    assert quiet.tokens_seen == loaded.tokens_seen > 0
    assert quiet.loss_curve == pytest.approx(loaded.loss_curve, rel=1e-5, abs=1e-6) and len(quiet.loss_curve) == 5
    a, b = _adapter_tensors(quiet.adapter_dir), _adapter_tensors(loaded.adapter_dir)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert any(float(v.abs().max()) > 0 for k, v in a.items() if "lora_B" in k)  # it trained: B moved off zero
    assert quiet.metrics()["steps"] == 5 and quiet.metrics()["row_stats"]["turns"] == 4 * 3
    # The clock is only a safety stop: crossing it fails the run, naming the setting, and saves no shorter adapter.
    with pytest.raises(TrainingWallClockExceeded, match=r"max_wall_s=1e-06"):
        train_adapter(TrainConfig(algorithm="distill", max_steps=5, batch_size=2, max_length=256, max_wall_s=1e-6), base, logs, tmp_path / "late")
    assert not (tmp_path / "late" / "adapter_model.safetensors").exists()


def test_an_expert_walk_that_missed_the_evidence_teaches_no_answer(tmp_path, tiny_tokenizer):
    from agenttune_lib.corpus import Document
    from agenttune_lib.rag import SearchCorpusTool
    from agenttune_lib.rag.backends import BM25Backend
    from agenttune_lib.rag.chunking import chunk_documents
    from agenttune_lib.rl.distill import filter_teacher_trajectories, weighted_token_rows
    from agenttune_lib.spine.collect import collect_teacher, expert_qa_tasks
    from agenttune_lib.teachers import QAExpertTeacher
    from agenttune_lib.teachers.qa import NOT_FOUND

    docs = [
        Document.create("The Licensor grants a Beta Licence to the Evaluator for internal testing only.", "f", "a.txt"),
        Document.create("Payment terms: invoices are due within thirty days of receipt.", "f", "c.txt"),
        Document.create("Governing law: this agreement is governed by the laws of Ontario.", "f", "d.txt"),
    ]
    chunks, _ = chunk_documents(docs)
    start = next(c.chunk_id for c in chunks if "Licensor" in c.text)
    search = SearchCorpusTool(BM25Backend.build(chunks, tmp_path / "index"), k=1)
    # The second hop's gold chunk (which says "ninety days") is not in the index: no search can retrieve it.
    row = {"qa_id": "q1", "question": "Under the evaluation grant, how long until the granted licence ends?", "answer": "ninety days",
           "gold_chunk_ids": [start, "missing-chunk"], "hops": 2}
    teacher = QAExpertTeacher(search, [row], tiny_tokenizer)
    log = collect_teacher(teacher, expert_qa_tasks([row], teacher)).logs[0]
    final = log.filter(EventKind.TEXT)[-1].payload["content"]
    assert final == NOT_FOUND and "ninety" not in final
    assert log.metadata["answer_in_context"] is False
    assert log.rewards("episode") == [0.0]  # not a success
    report = filter_teacher_trajectories([log])
    assert report.kept == [] and report.dropped == {log.id: "below_success_threshold"}
    rows = weighted_token_rows([log], tiny_tokenizer)
    assert all("ninety" not in t for t in _loss_texts(rows, tiny_tokenizer))


def test_the_teacher_check_refuses_evidence_free_success(tiny_tokenizer):
    """evidence_figures (the teacher_trajectories_evidence check) flags low recall, low answer-in-context and a success without the answer."""
    from agenttune_lib.spine.collect import evidence_figures

    good = _episode(tiny_tokenizer, tool_chars=100, hops=1)
    good.metadata.update({"evidence": [{"hop": 1, "chunk_id": "c1", "search": 0}], "answer_in_context": True})
    fake = _episode(tiny_tokenizer, tool_chars=100, hops=1)  # rewarded 1.0, yet its searches never showed the answer
    fake.metadata.update({"evidence": [{"hop": 1, "chunk_id": "c2", "search": None}], "answer_in_context": False})
    ok = evidence_figures([good])
    assert ok["problems"] == [] and ok["hop_recall"] == 1.0 and ok["answer_in_context_rate"] == 1.0
    fake2 = _episode(tiny_tokenizer, tool_chars=100, hops=1)
    fake2.metadata.update({"evidence": [{"hop": 1, "chunk_id": "c3", "search": None}], "answer_in_context": False})
    bad = evidence_figures([good, fake, fake2])
    assert bad["problems"] == ["gold-hop recall 1/3 = 0.33 is below 0.60", "answer in context 1/3 = 0.33 is below 0.40",
                               f"episode {fake.id} succeeded without the answer in its context",
                               f"episode {fake2.id} succeeded without the answer in its context"]
    assert evidence_figures([good, good, fake])["problems"] == [f"episode {fake.id} succeeded without the answer in its context"]


def _no_tool_episode(tok, reply: str = "None of my tools can cancel an order, so I will not call them.",
                     kind: str = "unfit_near") -> EventLog:
    from agenttune_lib.rl.rollout import episode_to_eventlog

    log, _ = episode_to_eventlog(tok, None, "Please cancel my pending order #W1.", [{"kind": "text", "payload": {"content": reply}}],
                                 metadata={"answer": reply, "teacher": "expert_no_tool:unfit-or-unneeded/1",
                                           "teacher_task_id": f"no_tool:{kind}:0"})
    events = [*log.events, Event(EventKind.REWARD, {"value": 1.0}, scope="episode")]
    return EventLog(events, tier="full", id=log.id, metadata=dict(log.metadata), token_ids=log.token_ids)


def test_no_tool_repeats_puts_each_decline_that_many_times_in_the_rows(tmp_path, tiny_tokenizer):
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl.train import TrainConfig, train_adapter

    base = save_tiny_model(tmp_path / "base")
    logs = [_episode(tiny_tokenizer, tool_chars=300, hops=2), _no_tool_episode(tiny_tokenizer)]
    rows = {}
    for n in (1, 3):
        cfg = TrainConfig(algorithm="distill", max_steps=1, batch_size=2, max_length=256, no_tool_repeats=n)
        rows[n] = train_adapter(cfg, base, logs, tmp_path / f"r{n}").metrics()["row_stats"]["training_rows"]
    assert rows[3] == rows[1] + 2  # the search episode's rows once, the decline's one row three times
    with pytest.raises(ValueError, match="no_tool_repeats must be an integer >= 1, got 0"):
        TrainConfig(algorithm="distill", no_tool_repeats=0)


def test_no_tool_repeat_kinds_repeats_only_the_named_kinds(tiny_tokenizer):
    from agenttune_assets.defs.assets.train import DistillSettings, TrainedAdapterConfig
    from agenttune_lib.rl.train import no_tool_kind, repeat_no_tool

    search = _episode(tiny_tokenizer, tool_chars=300, hops=2)
    near = _no_tool_episode(tiny_tokenizer, kind="unfit_near")
    offered_search = _no_tool_episode(tiny_tokenizer, "I can only search the contract corpus.", kind="unfit_search")
    assert [no_tool_kind(log) for log in (search, near, offered_search)] == [None, "unfit_near", "unfit_search"]
    out = repeat_no_tool([search, near, offered_search], 4, ("unfit_near",))
    assert [log.id for log in out] == [search.id, near.id, offered_search.id] + [near.id] * 3
    assert len(repeat_no_tool([search, near, offered_search], 4)) == 3 + 2 * 3  # no kinds named: every no-tool kind
    cfg = TrainedAdapterConfig(distill=DistillSettings(no_tool_repeats=4, no_tool_repeat_kinds=["unfit_near", "upper"]))
    assert cfg.to_lib("distill", False, 0).no_tool_repeat_kinds == ("unfit_near", "upper")
    with pytest.raises(ValueError, match=r"distill.no_tool_repeat_kinds: unknown kind\(s\) \['unfit_nearr'\]"):
        TrainedAdapterConfig(distill=DistillSettings(no_tool_repeat_kinds=["unfit_nearr"])).to_lib("distill", False, 0)
