"""Blocking checks on qa_splits, written as Great Expectations 1.x suites run inside a Dagster multi-asset check
(the dagster-ge integration supports only GX < 1.0)."""

from collections import defaultdict
from typing import Any

import dagster as dg

from agenttune_assets.defs.resources import ArtifactsResource, WarehouseResource
from agenttune_lib.rag.splits import answer_diversity, load_qa_split, split_health
from agenttune_lib.rag.workflow import RagPaths
from agenttune_lib.warehouse.queries import chunk_ids

CHECKS = {
    "qa_split_gold_chunks_disjoint": "No gold chunk is shared across train and validation.",
    "qa_hops_in_range": "Every item has 2 to 5 hops.",
    "qa_nonempty_question_answer": "No empty question or answer.",
    "qa_gold_chunks_exist": "Every gold chunk id exists in corpus_chunks.",
    "qa_validation_not_degenerate": "Validation is non-empty, has every hop count, hop shares within tolerance, and spans enough documents.",
    "qa_answer_diversity": "Kept items have at least the configured number of unique answers and answer types.",
}


def _frames(items: list[dict[str, Any]]):
    import pandas as pd

    splits_of: dict[str, set[str]] = defaultdict(set)
    for it in items:
        for cid in it["gold_chunk_ids"]:
            splits_of[cid].add(it["split"])
    item_df = pd.DataFrame(
        {
            "qa_id": [it["qa_id"] for it in items],
            "hops": [int(it["hops"]) if it.get("hops") is not None else None for it in items],
            "question_chars": [len(str(it.get("question") or "").strip()) for it in items],
            "answer_chars": [len(str(it.get("answer") or "").strip()) for it in items],
        }
    )
    gold_df = pd.DataFrame(
        [{"qa_id": it["qa_id"], "chunk_id": cid, "n_splits": len(splits_of[cid])} for it in items for cid in it["gold_chunk_ids"]],
        columns=["qa_id", "chunk_id", "n_splits"],
    )
    return item_df, gold_df


def validate_qa_split(items: list[dict[str, Any]], chunk_ids: set[str], min_hops: int = 2, max_hops: int = 5) -> dict[str, dict[str, Any]]:
    """Run the four GX suites over QA items (dicts with qa_id, split, question, answer, hops, gold_chunk_ids)."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    item_df, gold_df = _frames(items)
    context = gx.get_context(mode="ephemeral")
    source = context.data_sources.add_pandas("qa_splits")
    batches = {
        "items": source.add_dataframe_asset("items").add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": item_df}),
        "gold": source.add_dataframe_asset("gold").add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": gold_df}),
    }
    suites = {
        "qa_split_gold_chunks_disjoint": ("gold", [gxe.ExpectColumnValuesToBeBetween(column="n_splits", min_value=1, max_value=1)]),
        "qa_hops_in_range": ("items", [gxe.ExpectColumnValuesToNotBeNull(column="hops"), gxe.ExpectColumnValuesToBeBetween(column="hops", min_value=min_hops, max_value=max_hops)]),
        "qa_nonempty_question_answer": ("items", [gxe.ExpectColumnValuesToBeBetween(column="question_chars", min_value=1), gxe.ExpectColumnValuesToBeBetween(column="answer_chars", min_value=1)]),
        "qa_gold_chunks_exist": ("gold", [gxe.ExpectColumnValuesToBeInSet(column="chunk_id", value_set=sorted(chunk_ids))]),
    }
    out = {}
    for name, (batch_name, expectations) in suites.items():
        suite = gx.ExpectationSuite(name=name, expectations=expectations)
        result = batches[batch_name].validate(suite)
        failures = [
            {"expectation": r.expectation_config.type, "column": r.expectation_config.kwargs.get("column"),
             "unexpected_count": r.result.get("unexpected_count"), "examples": [str(v) for v in (r.result.get("partial_unexpected_list") or [])[:5]]}
            for r in result.results if not r.success
        ]
        out[name] = {"passed": bool(result.success) and (len(items) > 0), "failures": failures, "rows": len(item_df) if batch_name == "items" else len(gold_df)}
        if not items:
            out[name]["failures"].append({"expectation": "non-empty split", "unexpected_count": 0, "examples": []})
    return out


def _thresholds(artifacts: ArtifactsResource) -> dict[str, int]:
    """The thresholds qa_splits was materialized with (metrics.json), else the SynthesisConfig defaults."""
    import json

    from agenttune_lib.rag.synthesis.pipeline import SynthesisConfig

    d = SynthesisConfig()
    out = {"min_val_documents": d.min_val_documents, "min_unique_answers": d.min_unique_answers, "min_answer_types": d.min_answer_types}
    path = RagPaths.under(artifacts.get()).synthesis / "metrics.json"
    if path.exists():
        out.update(json.loads(path.read_text()).get("thresholds") or {})
    return out


def _chunk_ids(wh, artifacts: ArtifactsResource) -> set[str]:
    """The chunk ids of the current corpus_chunks materialization (its Parquet), else every stored chunk."""
    path = RagPaths.under(artifacts.get()).chunks
    if path.exists():
        import pyarrow.parquet as pq

        return set(pq.read_table(path, columns=["chunk_id"]).column("chunk_id").to_pylist())
    return chunk_ids(wh)


@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(name, asset="qa_splits", blocking=True, description=desc) for name, desc in CHECKS.items()],
    can_subset=False,
)
def qa_splits_checks(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource, artifacts: ArtifactsResource):
    """Leakage, hop range, empty text, dangling gold-chunk ids, a degenerate validation side and too little answer
    diversity in the newest train/validation split."""
    wh = warehouse.get()
    items = [{**row, "split": split} for split in ("train", "validation") for row in load_qa_split(wh, split)]
    results = validate_qa_split(items, _chunk_ids(wh, artifacts))
    thresholds = _thresholds(artifacts)
    for name, res in (("qa_validation_not_degenerate", split_health(items, thresholds["min_val_documents"])),
                      ("qa_answer_diversity", answer_diversity(items, thresholds["min_unique_answers"], thresholds["min_answer_types"]))):
        stats = {k: v for k, v in res.items() if k not in ("passed", "problems")}
        results[name] = {"passed": res["passed"], "failures": [{"problem": p} for p in res["problems"]], "rows": len(items), "stats": {**stats, "thresholds": thresholds}}
    for name, res in results.items():
        yield dg.AssetCheckResult(
            asset_key="qa_splits",
            check_name=name,
            passed=res["passed"],
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"rows": res["rows"], "items": len(items), "failures": dg.MetadataValue.json(res["failures"]), **({"stats": dg.MetadataValue.json(res["stats"])} if "stats" in res else {})},
        )
