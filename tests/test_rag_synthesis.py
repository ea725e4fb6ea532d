"""The six-stage synthesis pipeline, extract_json, split_by_gold_chunks, curriculum and the state compressor."""
from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agenttune_lib.corpus import Document
from agenttune_lib.rag.curriculum import CurriculumSampler, build_curriculum, probe_solve_rate
from agenttune_lib.rag.memory import StateCompressor
from agenttune_lib.rag.metrics import answer_in
from agenttune_lib.rag.splits import split_by_gold_chunks
from agenttune_lib.rag.synthesis import SynthesisConfig, SynthesisError, extract_json, run_pipeline
from agenttune_lib.rag.synthesis.jsonx import JSONExtractionError
from agenttune_lib.rag.synthesis.difficulty import power_mean
from _rag_helpers import HashEmbedder, ScriptedLLM, licensed_documents


def test_extract_json_direct_fenced_and_brace_scan():
    assert extract_json('{"a": 1}') == {"a": 1}
    assert extract_json('Sure!\n```json\n{"q": "x", "a": [1, 2]}\n```\nDone.') == {"q": "x", "a": [1, 2]}
    assert extract_json('Here you go: {"question": "what is {x}?", "answer": "b\\"c"} trailing } junk') == {"question": "what is {x}?", "answer": 'b"c'}
    assert extract_json("noise {not json} then [1, 2, 3]") == [1, 2, 3]
    with pytest.raises(JSONExtractionError, match="no JSON"):
        extract_json("no json here {at all")


@pytest.fixture(scope="module")
def synthesis(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    cache = tmp_path_factory.mktemp("cache")
    docs = licensed_documents()
    result = run_pipeline(docs, out / "run1", embedder=HashEmbedder(), config=SynthesisConfig(max_candidates=160), cache_dir=cache)
    return result, docs, cache, out


def test_pipeline_writes_every_stage_and_the_paper_outputs(synthesis):
    result, _, _, _ = synthesis
    files = result.files
    for name in ("stage1_chunks.parquet", "stage1_edges.parquet", "stage2_paths.parquet", "stage3_candidates.parquet", "stage4_verified.parquet",
                 "stage5_difficulty.parquet", "dataset_grpo.jsonl", "dataset_all.parquet", "dataset_all.csv", "metrics.json", "manifest.json"):
        assert name in files, name
    for stage in ("stage3_candidates.parquet", "stage4_verified.parquet"):
        cols = pq.read_table(files[stage]).column_names
        assert {"model", "prompt_tokens", "completion_tokens", "cost_usd", "latency_s"} <= set(cols)
    grpo = [json.loads(line) for line in files["dataset_grpo.jsonl"].read_text().splitlines()]
    assert grpo and {"prompt", "answer", "gold_path"} <= set(grpo[0])
    manifest = json.loads(files["manifest.json"].read_text())
    assert set(manifest["files"]) >= {"dataset_grpo.jsonl", "metrics.json"}
    edges = pq.read_table(files["stage1_edges.parquet"]).to_pydict()
    assert {"exact", "contextual"} <= set(edges["type"])


def test_kept_questions_are_grounded_multi_hop_and_split_without_leakage(synthesis):
    result, _, _, _ = synthesis
    m = result.metrics
    assert m["funnel"]["candidates"] >= m["funnel"]["verified"] >= m["funnel"]["gated"] > 10
    assert not m["split"]["degenerate"] and result.validation and result.train
    train_gold = {c for r in result.train for c in r["gold_chunk_ids"]}
    val_gold = {c for r in result.validation for c in r["gold_chunk_ids"]}
    assert not train_gold & val_gold
    chunks = pq.read_table(result.files["stage1_chunks.parquet"]).to_pydict()
    text = dict(zip(chunks["chunk_id"], chunks["text"]))
    doc = dict(zip(chunks["chunk_id"], chunks["doc_id"]))
    for r in result.train + result.validation:
        assert 2 <= r["hops"] <= 5
        assert len({doc[c] for c in r["gold_chunk_ids"]}) == 1, "paths stay inside one document"
        assert r["answer_chunk_id"] == r["gold_chunk_ids"][-1], "gold chunks are in hop order: the answer passage is last"
        assert answer_in(r["answer"], text[r["gold_chunk_ids"][-1]])
        assert not any(answer_in(r["answer"], text[c]) for c in r["gold_chunk_ids"][:-1]), "an earlier hop must not hold the answer"
        assert not answer_in(r["answer"], r["question"])
        assert not any(b and f" {b.lower()} " in f" {r['question'].lower()} " for b in r["bridge_terms"]), "bridges stay hidden"
        assert [h["chunk_id"] for h in r["chain"]] == list(r["gold_chunk_ids"]) and r["answer_type"]
        assert r["difficulty_cell"].startswith(f"{r['hops']}-hop/")
    assert m["quality"]["answerability"] == 1.0
    assert sum(sum(row.values()) for row in m["difficulty_matrix"].values()) == m["funnel"]["gated"]


def test_rejected_candidates_keep_their_discard_reason(synthesis):
    result, _, _, _ = synthesis
    rows = pq.read_table(result.files["dataset_all.parquet"]).to_pylist()
    discarded = [r for r in rows if r["status"] == "discarded"]
    assert discarded and all(r["discard_reason"] for r in discarded)
    assert {r["discard_reason"].split(":")[0] for r in discarded} <= {"generation", "answerability", "chain_dependency", "single_passage", "hidden_bridge",
                                                                       "retrieval_shortcut", "retrieval_necessity", "gate"}
    assert result.metrics["stages"]["stage4"]["checks_fired"].get("retrieval_shortcut", 0) > 0, "the shortcut check fires on a real corpus"


def test_stage1_is_cached_and_the_run_is_deterministic(synthesis):
    result, docs, cache, out = synthesis
    again = run_pipeline(docs, out / "run2", embedder=HashEmbedder(), config=SynthesisConfig(max_candidates=160), cache_dir=cache)
    assert again.metrics["stages"]["stage1"]["cache"] == "hit"
    assert result.metrics["stages"]["stage1"]["cache"] == "miss"
    assert [r["qa_id"] for r in again.train] == [r["qa_id"] for r in result.train]


def test_corpus_too_small_for_two_hops_is_a_clear_error(tmp_path):
    doc = Document.create("A single short paragraph about a licence fee.", "folder", "tiny.txt", "tiny")
    with pytest.raises(SynthesisError, match="too small for a 2-hop path"):
        run_pipeline([doc], tmp_path, embedder=HashEmbedder())


def test_no_usable_document_is_a_clear_error(tmp_path):
    with pytest.raises(SynthesisError, match="empty or unreadable"):
        run_pipeline([Document("x", "folder", "empty.txt", "e", "", "  ", {})], tmp_path, embedder=HashEmbedder())


def _last_passage(user):
    return re.split(r"PASSAGE \d+[^\n]*:\n", user.split("QUESTION:")[0])[-1]


def _word_of_last_passage(messages):
    words = re.findall(r"[A-Za-z]{6,}", _last_passage(messages[-1]["content"]))
    return words[len(words) // 2]


def test_llm_generator_verifier_and_one_targeted_regeneration(tmp_path):
    state = {"gen": 0}

    def reply(messages):
        system = messages[0]["content"]
        if "multi-hop questions" in system:
            state["gen"] += 1
            answer = _word_of_last_passage(messages)
            if "previous attempt was rejected" not in messages[-1]["content"]:
                return f'Sure. ```json\n{{"answer": "{answer}", "question": "Is it {answer}?"}}\n```'
            return {"answer": answer, "question": "Which word, found via the last passage, starts the chain?"}
        if "QUESTION:" in messages[-1]["content"] and "PASSAGE 1" in messages[-1]["content"] and "PASSAGE 2" in messages[-1]["content"]:
            return {"answer": "see passages"}  # not the gold answer: answerability fails
        return {"answer": "unknown"}

    docs = licensed_documents()[:6]
    llm = ScriptedLLM(reply)
    res = None
    with pytest.raises(SynthesisError, match="no candidate survived"):
        res = run_pipeline(docs, tmp_path, llm=llm, embedder=HashEmbedder(), config=SynthesisConfig(max_candidates=6))
    assert res is None
    rows = pq.read_table(tmp_path / "stage4_verified.parquet").to_pylist()
    first = [r for r in rows if r["attempt"] == 0 and r["status"] == "discarded" and r["question"]]
    assert first and all(r["discard_reason"].startswith("retrieval_necessity") or r["discard_reason"].startswith("answerability") for r in first)
    retries = [r for r in rows if r["attempt"] == 1]
    assert retries and all("after regeneration" in r["discard_reason"] for r in retries)
    calls = pq.read_table(tmp_path / "stage3_calls.parquet").to_pylist()
    assert calls and all(c["prompt_tokens"] > 0 and c["model"] == "scripted" for c in calls)
    assert any("previous attempt was rejected" in c[-1]["content"] for c in llm.calls)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=4), min_size=0, max_size=60), st.floats(0.05, 0.6))
def test_split_by_gold_chunks_never_leaks(golds, fraction):
    items = [{"qa_id": i, "gold_chunk_ids": [f"c{g}" for g in gs]} for i, gs in enumerate(golds)]
    train, val, report = split_by_gold_chunks(items, fraction)
    assert len(train) + len(val) == len(items)
    assert not {c for r in train for c in r["gold_chunk_ids"]} & {c for r in val for c in r["gold_chunk_ids"]}
    assert report.degenerate == bool(report.reason)
    if not val or not train:
        assert report.degenerate


def test_split_marks_degenerate_instead_of_breaking_disjointness():
    items = [{"qa_id": i, "gold_chunk_ids": ["shared", f"c{i}"]} for i in range(10)]
    train, val, report = split_by_gold_chunks(items, 0.3)
    assert report.degenerate and len(train) == 10 and not val
    assert "component" in report.reason


def test_power_mean_is_dominated_by_the_smallest_value():
    assert power_mean([0.9, 0.9, 0.9]) == pytest.approx(0.9)
    assert power_mean([0.9, 0.9, 0.1]) < 0.15 < sum([0.9, 0.9, 0.1]) / 3


def test_curriculum_orders_easy_to_hard_and_sampler_unlocks_stages():
    items = [{"qa_id": f"q{i}", "question": f"q{i}", "answer": "yes" if i < 5 else "no", "difficulty": i / 10, "retrieval_difficulty": i / 10} for i in range(10)]
    stages = build_curriculum(items, n_stages=3)
    assert [len(s) for s in stages] == [4, 3, 3] and stages[0][0]["qa_id"] == "q0" and stages[-1][-1]["qa_id"] == "q9"
    rates = probe_solve_rate(items, lambda q: "yes")
    assert rates["q0"] == 1.0 and rates["q9"] == 0.0
    probed = build_curriculum(items, solve_rate=rates, n_stages=2)
    assert {i["qa_id"] for i in probed[0]} == {f"q{i}" for i in range(5)}
    sampler = CurriculumSampler(stages, batch_size=3, steps_per_stage=2, seed=0)
    first = [sampler.next_batch() for _ in range(2)]
    assert all(i in stages[0] for b in first for i in b)
    later = [sampler.next_batch() for _ in range(10)]
    assert any(i in stages[2] for b in later for i in b)


def test_state_compressor_keeps_context_bounded_and_relevant():
    comp = StateCompressor(max_chars=300)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is the refund period?"}]
    for i in range(30):
        messages.append({"role": "assistant", "content": f"search {i}"})
        filler = f"Clause {i} concerns export controls and shipping."
        fact = " The refund period is 30 days." if i == 3 else ""
        messages.append({"role": "tool", "content": filler + fact})
        compact = comp.compress_messages(messages, "What is the refund period?")
        assert len(compact) <= 4 and len(comp.state) <= 300
    assert "refund period is 30 days" in comp.state
    assert comp.updates == 30


def test_injected_fakes_with_plain_interfaces_run_all_six_stages(tmp_path):
    """A client returning plain strings from complete(messages) and an embedder with embed() are enough."""

    class PlainLLM:
        model = "plain"

        def complete(self, messages):
            user = messages[-1]["content"]
            if "multi-hop questions" in messages[0]["content"]:
                return json.dumps({"answer": _word_of_last_passage(messages), "question": "Starting from the last passage, what does the chain lead to?"})
            if "QUESTION:" in user and "PASSAGE 2" in user:
                words = re.findall(r"[A-Za-z]{6,}", _last_passage(user))
                return json.dumps({"answer": words[len(words) // 2]})
            return "I do not know."

    class EmbedOnly:
        def __init__(self):
            self.inner = HashEmbedder()

        def embed(self, texts):
            return self.inner.encode(texts) * 3.0  # not normalised on purpose

    result = run_pipeline(licensed_documents()[:6], tmp_path, llm=PlainLLM(), embedder=EmbedOnly(), config=SynthesisConfig(max_candidates=20))
    assert result.metrics["funnel"]["gated"] > 0
    calls = pq.read_table(tmp_path / "stage4_calls.parquet").to_pylist()
    assert {c["purpose"] for c in calls if c["stage"] == "stage4_verify"} == {"answerability", "single_passage", "retrieval_necessity"}
    rows = pq.read_table(tmp_path / "stage4_verified.parquet").to_pylist()  # the LLM's items go through the same chain checks
    assert all(r["answer_chunk_id"] == r["gold_chunk_ids"][-1] for r in rows if r["status"] == "kept")
