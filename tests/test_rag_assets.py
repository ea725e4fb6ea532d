"""The corpus-group RAG assets end to end in Dagster, the GX-backed blocking checks, and the split loader."""
from __future__ import annotations

import dagster as dg
import pytest

from agenttune_assets.defs.asset_checks.rag import CHECKS, qa_splits_checks, validate_qa_split
from agenttune_assets.defs.assets import corpus, rag
from agenttune_assets.defs.resources import default_resources
from agenttune_lib.rag.splits import load_qa_split, write_qa_items
from _rag_helpers import SMALL_KEYS

RAG_ASSETS = [rag.corpus_chunks, rag.retrieval_index, rag.knowledge_graph, rag.qa_candidates, rag.qa_verified, rag.qa_splits]


def _items():
    return [
        {"qa_id": "a", "split": "train", "question": "q1?", "answer": "x", "hops": 2, "gold_chunk_ids": ["c1", "c2"]},
        {"qa_id": "b", "split": "train", "question": "q2?", "answer": "y", "hops": 3, "gold_chunk_ids": ["c2", "c3", "c4"]},
        {"qa_id": "c", "split": "validation", "question": "q3?", "answer": "z", "hops": 2, "gold_chunk_ids": ["c5", "c6"]},
    ]


def test_gx_suites_pass_a_clean_split_and_catch_each_defect():
    chunk_ids = {f"c{i}" for i in range(1, 7)}
    assert all(r["passed"] for r in validate_qa_split(_items(), chunk_ids).values())
    leaked = _items() + [{"qa_id": "d", "split": "validation", "question": "q4?", "answer": "w", "hops": 2, "gold_chunk_ids": ["c1", "c6"]}]
    res = validate_qa_split(leaked, chunk_ids)
    assert not res["qa_split_gold_chunks_disjoint"]["passed"]
    assert res["qa_split_gold_chunks_disjoint"]["failures"][0]["unexpected_count"] >= 2
    assert res["qa_hops_in_range"]["passed"] and res["qa_gold_chunks_exist"]["passed"]
    bad = _items()
    bad[0]["hops"], bad[1]["answer"], bad[2]["gold_chunk_ids"] = 6, "  ", ["c5", "ghost"]
    res = validate_qa_split(bad, chunk_ids)
    assert not res["qa_hops_in_range"]["passed"]
    assert not res["qa_nonempty_question_answer"]["passed"]
    assert not res["qa_gold_chunks_exist"]["passed"] and "ghost" in res["qa_gold_chunks_exist"]["failures"][0]["examples"]
    assert not any(r["passed"] for r in validate_qa_split([], chunk_ids).values())


def _run_config(max_candidates: int = 400) -> dict:
    synth = {"config": {"max_candidates": max_candidates, "min_unique_answers": 5, "min_answer_types": 2, "min_val_documents": 2}}
    return {
        "ops": {
            "corpus_documents": {"config": {"categories": [], "license_keys": list(SMALL_KEYS)}},
            "knowledge_graph": synth, "qa_candidates": synth, "qa_verified": synth, "qa_splits": synth,
        }
    }


@pytest.fixture(scope="module")
def materialized(tmp_path_factory):
    home = tmp_path_factory.mktemp("rag_home")
    mp = pytest.MonkeyPatch()
    mp.setenv("AGENTTUNE_HOME", str(home))
    result = dg.materialize([corpus.corpus_documents, *RAG_ASSETS, qa_splits_checks], resources=default_resources(), run_config=_run_config(), raise_on_error=False)
    yield result, home
    mp.undo()


@pytest.mark.slow
def test_assets_materialize_with_funnel_metrics_and_passing_checks(materialized):
    result, home = materialized
    assert result.success
    materializations = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()]
    meta = {m.asset_key.to_user_string(): m.metadata for m in materializations}
    split_meta = meta["qa_splits"]
    assert "data:image/png;base64," in split_meta["funnel"].value
    assert "hops" in split_meta["difficulty_matrix"].value
    for backend in ("bm25", "dense", "hybrid"):
        assert f"| {backend} |" in split_meta["retrieval_metrics"].value
    assert split_meta["degenerate"].value is False and split_meta["validation"].value > 0
    audit = split_meta["audit_sample"].value  # the audit sample a person reads in the UI: chain, bridges, answer, verdicts
    assert audit.count("> **Q:**") == min(20, split_meta["train"].value + split_meta["validation"].value)
    assert "hop 1 (start)" in audit and "***" in audit and "retrieval_shortcut ✓" in audit
    evaluations = {e.event_specific_data.check_name: e.event_specific_data.passed for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert evaluations == {name: True for name in CHECKS}


@pytest.mark.slow
def test_warehouse_rows_join_qa_items_to_chunks_to_documents(materialized):
    _, home = materialized
    from agenttune_lib.warehouse import Warehouse

    wh = Warehouse(home / "warehouse.duckdb")
    train, val = load_qa_split(wh, "train"), load_qa_split(wh, "validation")
    assert train and val and set(train[0]) >= {"qa_id", "question", "answer", "gold_chunk_ids"}
    assert not {c for r in train for c in r["gold_chunk_ids"]} & {c for r in val for c in r["gold_chunk_ids"]}
    joined = wh.execute(
        "SELECT count(*), count(d.doc_id) FROM (SELECT unnest(gold_chunk_ids) AS chunk_id FROM qa_items) g "
        "LEFT JOIN chunks c USING (chunk_id) LEFT JOIN documents d ON d.doc_id = c.doc_id"
    )[0]
    assert joined[0] > 0 and joined[0] == joined[1]


@pytest.mark.slow
def test_a_leaked_split_fails_the_blocking_check_and_stops_downstream(tmp_path, monkeypatch, materialized):
    _, home = materialized
    monkeypatch.setenv("AGENTTUNE_HOME", str(home))
    from agenttune_lib.warehouse import Warehouse

    wh = Warehouse(home / "warehouse.duckdb")
    train, val = load_qa_split(wh, "train"), load_qa_split(wh, "validation")

    @dg.asset(name="qa_splits", group_name="corpus")
    def leaked_qa_splits() -> None:
        """Test-only stand-in: republishes the real split with one training question copied into validation."""
        rows = [dict(r, split="train") for r in train] + [dict(r, split="validation") for r in val]
        rows.append(dict(train[0], qa_id="qa-leaked", split="validation"))
        write_qa_items(wh, rows, "leaked-version")

    ran = []

    @dg.asset(deps=["qa_splits"])
    def training_consumer() -> None:
        ran.append(True)

    result = dg.materialize([leaked_qa_splits, qa_splits_checks, training_consumer], resources=default_resources(), raise_on_error=False)
    assert not result.success and not ran
    evaluations = {e.event_specific_data.check_name: e.event_specific_data.passed for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert evaluations["qa_split_gold_chunks_disjoint"] is False
    assert evaluations["qa_hops_in_range"] is True
