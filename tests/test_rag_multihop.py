"""Hidden-bridge multi-hop questions: typed answers, the retrieval-shortcut and single-passage checks firing, a
hidden-bridge 2-hop item kept, near-duplicate and diversity gating, the stratified split and the chain rows."""
from __future__ import annotations

import pytest

from agenttune_lib.rag.backends import build_index, load_backend
from agenttune_lib.rag.chunking import Chunk
from agenttune_lib.rag.metrics import answer_in
from agenttune_lib.rag.splits import split_by_gold_chunks
from agenttune_lib.rag.synthesis.answers import extract_spans, unique_spans
from agenttune_lib.rag.synthesis.generate import Candidate, ExtractiveGenerator, PathContext, chain_of
from agenttune_lib.rag.synthesis.verify import ChainChecks, ExtractiveVerifier, answerability_gate, verify_candidates
from _rag_helpers import HashEmbedder

TITLE = "Widget Supply Agreement"
START = ("Premium onboarding workshops and quarterly calibration visits are offered to every customer enrolled in the "
         "Platinum Tier. The supplier schedules the calibration visits with the customer's facilities team.")
ANSWER = ("Either party may end the Platinum Tier by giving the other party thirty (30) days prior written notice. "
          "Fees already paid for the current quarter are not refunded.")
FILLERS = [f"Batch {i} of the widgets ships from warehouse {i} by freight carrier on pallet layout {i}." for i in range(14)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    texts = [START, ANSWER, *FILLERS]
    chunks = [Chunk(f"ch-{i:02d}", "doc-widget", i, t, TITLE) for i, t in enumerate(texts)]
    other = [Chunk(f"ch-o{i:02d}", "doc-other", i, f"Clause {i} of the reseller terms covers marketing funds, logo use and trade shows in territory {i}.", "Reseller Terms")
             for i in range(10)]
    root = tmp_path_factory.mktemp("index")
    embedder = HashEmbedder()
    build_index(chunks + other, root, embedder)
    backends = {k: load_backend(root, k, embedder=embedder) for k in ("bm25", "dense", "hybrid")}
    ctx = PathContext(
        "p-test", ["ch-01", "ch-00"], ["doc-widget"] * 2, [TITLE] * 2, [ANSWER, START],
        entities=[["Platinum Tier"], ["Platinum Tier"]], keyphrases=[["prior written notice"], ["onboarding workshops", "calibration visits"]],
        edge_terms=[["Platinum Tier"]], edge_types=["exact"], doc_texts=texts,
    )
    return backends, ctx


def test_typed_spans_come_from_pattern_rules():
    spans = {(s.answer_type, s.text) for s in extract_spans(
        'This Agreement is governed by the laws of the State of Delaware. Acme Widgets, Inc. ("Supplier") may raise fees by 5% '
        "on thirty (30) days' notice, up to $10,000, from January 1, 2025, as set out in Section 4.2.")}
    assert {("governing_law", "State of Delaware"), ("party", "Acme Widgets, Inc."), ("defined_term", "Supplier"), ("percentage", "5%"),
            ("notice_period", "thirty (30) days"), ("amount", "$10,000"), ("date", "January 1, 2025"), ("section_ref", "Section 4.2")} <= spans
    assert not [s for s in unique_spans("Pay within 10 days; deliver within 20 days.") if s.answer_type in ("duration", "notice_period")]


def test_hidden_bridge_two_hop_item_is_kept(corpus):
    backends, ctx = corpus
    gen = ExtractiveGenerator()
    cand = gen.generate(ctx)
    assert cand.status == "candidate", cand.discard_reason
    assert cand.gold_chunk_ids == ["ch-00", "ch-01"] and cand.answer_chunk_id == "ch-01"  # hop order: start, then answer
    assert cand.answer == "thirty (30) days" and cand.answer_type == "notice_period"
    assert cand.bridge_terms == ["Platinum Tier"] and "platinum" not in cand.question.lower()  # the bridge is never named
    assert not answer_in(cand.answer, cand.question)
    checks = ChainChecks(backends, k=8)
    out = verify_candidates([cand], {ctx.path_id: ctx}, ExtractiveVerifier(), gen, chain_checks=checks)
    assert [c.status for c in out] == ["verified"], [c.discard_reason for c in out]
    kept = answerability_gate(out, {"ch-01": ANSWER})
    assert kept[0].status == "kept"
    for backend in backends.values():  # the question alone does not reach the answer passage...
        assert "ch-01" not in {h["chunk_id"] for h in backend.search(cand.question, 8)}
    assert "ch-00" in {h["chunk_id"] for h in backends["bm25"].search(cand.question, 3)}  # ...but finds where the chain starts
    chain = chain_of(cand)
    assert [(h["chunk_id"], h["bridge_in"], h["bridge_out"]) for h in chain] == [("ch-00", "", "Platinum Tier"), ("ch-01", "Platinum Tier", "")]


def test_question_reaching_the_answer_passage_alone_is_rejected(corpus):
    backends, ctx = corpus
    shortcut = Candidate("p-test:0", "p-test", ["ch-00", "ch-01"], 2, f"In {TITLE}, how much prior written notice ends the tier whose fees for the current quarter are not refunded?",
                         "thirty (30) days", "ch-01", ["doc-widget"], bridge_terms=["Platinum Tier"], answer_type="notice_period")
    checks = ChainChecks(backends, k=8)
    assert checks.single_passage(shortcut, ctx).startswith("single_passage")  # the answer passage holds the question's content words
    lexical_off = ChainChecks(backends, k=8, overlap=1.01)  # with the single-passage check out of the way, retrieval fires
    assert lexical_off([shortcut], {ctx.path_id: ctx})[0][0].startswith("retrieval_shortcut: the answer passage is in the top 8 of bm25")
    out = verify_candidates([shortcut], {ctx.path_id: ctx}, ExtractiveVerifier(), ExtractiveGenerator(), chain_checks=lexical_off)
    assert out[0].status == "discarded" and out[0].discard_reason.startswith("retrieval_shortcut")
    assert all(c.status == "discarded" for c in out)  # the one regeneration finds no second option on this path
    assert lexical_off.fired["retrieval_shortcut"] >= 1
    assert checks([shortcut], {ctx.path_id: ctx})[0][0].startswith("single_passage") and checks.fired["single_passage"] == 1
    named = Candidate("p-test:0", "p-test", ["ch-00", "ch-01"], 2, "Under the Platinum Tier, what notice ends it?", "thirty (30) days", "ch-01", ["doc-widget"],
                      bridge_terms=["Platinum Tier"])
    assert any(f.startswith("hidden_bridge") for f in ChainChecks()([named], {ctx.path_id: ctx})[0])


def test_gate_drops_near_duplicates_and_caps_repeated_answers():
    def cand(i, question, answer):
        c = Candidate(f"p{i}:0", f"p{i}", ["a", "b"], 2, question, answer, "b", ["d"])
        c.status = "verified"
        return c

    cands = [cand(0, "In X, what notice period applies in the passage that shares a defined term with the clause on audits?", "30 days"),
             cand(1, "In X, what notice period applies in the passage that shares a defined term with the clause on audit?", "60 days"),
             cand(2, "Which company is named where the agreement discusses export control?", "30 days"),
             cand(3, "Which governing law is chosen for the reseller programme?", "Delaware")]
    out = answerability_gate(cands, {"b": "30 days 60 days Delaware"})
    assert [c.status for c in out] == ["kept", "discarded", "discarded", "kept"]
    assert "near-duplicate" in out[1].discard_reason and "diversity cap" in out[2].discard_reason


def test_split_is_stratified_over_documents_and_hops():
    items = []
    for d in range(30):
        for j in range(4):
            hops = 2 + (d + j) % 4
            items.append({"qa_id": f"q{d}-{j}", "gold_chunk_ids": [f"d{d}-c{2 * j}", f"d{d}-c{2 * j + 1}"], "hops": hops, "doc_ids": [f"doc{d}"]})
    train, val, report = split_by_gold_chunks(items, 0.2, tolerance=0.1, min_val_documents=10)
    assert not report.degenerate, report.reason
    assert not {c for r in train for c in r["gold_chunk_ids"]} & {c for r in val for c in r["gold_chunk_ids"]}
    assert report.val_documents >= 10 and set(report.val_hops) == {"2", "3", "4", "5"} and report.hop_share_gap <= 0.1
    # a split whose validation cannot reach enough documents (all but one are tied up in one component) is degenerate
    hub = [{"qa_id": f"h{i}", "gold_chunk_ids": ["hub", f"x{i}"], "hops": 2 + i % 4, "doc_ids": [f"doc{i % 25}"]} for i in range(100)]
    solo = [{"qa_id": f"s{i}", "gold_chunk_ids": [f"y{i}"], "hops": 2 + i % 4, "doc_ids": ["solo"]} for i in range(25)]
    _, bad_val, bad = split_by_gold_chunks(hub + solo, 0.2, min_val_documents=10)
    assert bad.degenerate and "documents" in bad.reason and {r["doc_ids"][0] for r in bad_val} == {"solo"}


def test_blocking_split_checks_fail_a_degenerate_validation_side_and_thin_answers():
    from agenttune_lib.rag.splits import answer_diversity, split_health

    items = [{"qa_id": f"q{i}", "split": "validation" if i < 6 else "train", "hops": 2 + i % 3, "doc_ids": [f"doc{i % 30}"],
              "answer": f"{i} days", "answer_type": ("duration", "party", "date")[i % 3]} for i in range(30)]
    health = split_health(items, min_val_documents=5)
    assert health["passed"], health["problems"]
    one_doc = [dict(it, doc_ids=["doc0"]) if it["split"] == "validation" else it for it in items]
    assert "documents" in " ".join(split_health(one_doc, min_val_documents=5)["problems"])
    no_val = [dict(it, split="train") for it in items]
    assert split_health(no_val)["problems"] == ["the validation side is empty"]
    assert answer_diversity(items, 30, 3)["passed"]
    thin = answer_diversity([dict(it, answer="30 days", answer_type="duration") for it in items], 10, 2)
    assert not thin["passed"] and len(thin["problems"]) == 2


def test_qa_items_round_trip_the_chain_and_migrate_an_older_table(tmp_path):
    import pyarrow as pa

    from agenttune_lib.rag.splits import load_qa_split, write_qa_items
    from agenttune_lib.warehouse import Warehouse

    wh = Warehouse(tmp_path / "wh.duckdb")
    old = pa.table({"qa_id": ["old"], "split": ["train"], "question": ["q?"], "answer": ["a"], "gold_chunk_ids": [["c1"]], "hops": pa.array([2], pa.int32()),
                    "difficulty": [0.1], "retrieval_difficulty": [0.1], "difficulty_cell": [""], "answer_chunk_id": ["c1"], "doc_ids": [["d"]],
                    "dataset_version": ["v0"], "created_at": pa.array([0], pa.timestamp("us"))})
    wh.upsert_arrow("qa_items", old, key="qa_id")  # a warehouse written before answer_type/chain existed
    row = {"qa_id": "q1", "split": "validation", "question": "Which law governs?", "answer": "Delaware", "answer_type": "governing_law",
           "gold_chunk_ids": ["c1", "c2"], "answer_chunk_id": "c2", "hops": 2, "doc_ids": ["d"], "bridge_terms": ["Platinum Tier"], "clue": ["audit rights"]}
    write_qa_items(wh, [row], "v1")
    got = load_qa_split(wh, "validation")
    assert [r["qa_id"] for r in got] == ["q1"] and got[0]["answer_type"] == "governing_law" and got[0]["answer_chunk_id"] == "c2"
    assert got[0]["chain"] == [{"hop": 1, "chunk_id": "c1", "bridge_in": "", "bridge_out": "Platinum Tier", "clue": ["audit rights"]},
                               {"hop": 2, "chunk_id": "c2", "bridge_in": "Platinum Tier", "bridge_out": "", "clue": []}]
    write_qa_items(wh, got, "v2")  # rows read back write again unchanged
    assert load_qa_split(wh, "validation")[0]["chain"] == got[0]["chain"]


def test_openai_compatible_generator_goes_through_the_same_chain_checks(tmp_path):
    """An LLM over a local OpenAI-compatible endpoint that copies the answer passage's words into its question is
    caught by the single-passage / retrieval-shortcut checks, and the funnel reports it."""
    import json
    import re

    import pyarrow.parquet as pq
    from _chat_stub import chat_endpoint

    from agenttune_lib.rag.synthesis import SynthesisConfig, run_pipeline
    from agenttune_lib.rag.synthesis.llm import OpenAICompatLLMClient
    from _rag_helpers import licensed_documents

    def last_passage(user):
        return re.split(r"PASSAGE \d+[^\n]*:\n", user.split("QUESTION:")[0])[-1]

    def reply(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        words = re.findall(r"[A-Za-z]{7,}", last_passage(user))
        if "multi-hop questions" in system:  # a lazy generator: the answer passage's own words make the question
            content = {"answer": words[len(words) // 2], "question": "Which word appears near " + " ".join(words[:6]) + "?"}
        else:
            content = {"answer": words[len(words) // 2] if "PASSAGE" in user else "unknown"}
        return {"model": body["model"], "choices": [{"message": {"role": "assistant", "content": json.dumps(content)}}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}

    with chat_endpoint(reply, suffix="/v1") as (url, seen):
        llm = OpenAICompatLLMClient(url, "stub-model")
        with pytest.raises(Exception) as info:
            run_pipeline(licensed_documents()[:4], tmp_path, llm=llm, embedder=HashEmbedder(), config=SynthesisConfig(max_candidates=6))
    assert "no candidate survived" in str(info.value)
    rows = pq.read_table(tmp_path / "stage4_verified.parquet").to_pylist()
    reasons = {r["discard_reason"].split(":")[0] for r in rows if r["question"]}
    assert reasons & {"single_passage", "retrieval_shortcut"}, reasons
    assert any(r["answer_type"] == "llm" and r["gold_chunk_ids"][-1] == r["answer_chunk_id"] for r in rows)
    assert seen and all(s["path"] == "/v1/chat/completions" for s in seen)
