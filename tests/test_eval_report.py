"""Seed aggregation, recorded conditions, templates, and the TAC/LCF regression comparison."""
import pytest

from agenttune_lib.evaluation.report import aggregate_seeds
from agenttune_lib.evaluation.report_model import EvaluationConfig, EvaluationReport, compare_reports, latest_report, write_report
from agenttune_lib.evaluation.settings import EvalSettings, prompt_hash, serialize_history


def test_aggregate_seeds_mean_and_spread():
    agg = aggregate_seeds({0: {"acc": 0.5, "x": 1.0}, 1: {"acc": 1.0}, 2: {"acc": 0.0, "x": None}})
    assert agg["acc"]["mean"] == 0.5 and agg["acc"]["std"] == pytest.approx(0.5) and agg["acc"]["n_seeds"] == 3
    assert agg["x"] == {"mean": 1.0, "std": 0.0, "min": 1.0, "max": 1.0, "n_seeds": 1, "per_seed": {"0": 1.0}}
    with pytest.raises(ValueError):
        aggregate_seeds({})


def test_settings_record_and_validation():
    rec = EvalSettings().record("system prompt")
    assert rec["seeds"] == [0, 1, 2] and rec["template_mode"] == "native" and rec["keep_thinking_history"] is True
    assert rec["system_prompt_sha256"] == prompt_hash("system prompt") != prompt_hash("system prompt.")
    for bad in ({"template_mode": "chat"}, {"seeds": ()}, {"temperature": -1}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError):
            EvalSettings(**bad)
    assert EvaluationConfig().fingerprint() == EvaluationConfig().fingerprint() != EvaluationConfig(bfcl_limit=3).fingerprint()


def test_serialize_history_native_context_and_thinking():
    hist = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>plan</think>call"}, {"role": "tool", "content": "r"}]
    native = serialize_history("SYS", hist, EvalSettings())
    assert [m["role"] for m in native] == ["system", "user", "assistant", "tool"] and "<think>plan</think>" in native[2]["content"]
    stripped = serialize_history("SYS", hist, EvalSettings(keep_thinking_history=False))
    assert stripped[2]["content"] == "call"
    ctx = serialize_history("SYS", hist, EvalSettings(template_mode="context"))
    assert len(ctx) == 1 and ctx[0]["role"] == "user" and "SYS" in ctx[0]["content"] and "[tool] r" in ctx[0]["content"]


def _rep(adapter, tac, lcf, created="2026-01-01T00:00:00+00:00", rid=None):
    return EvaluationReport(report_id=rid or adapter, adapter_id=adapter, model_kind="adapter", base_model="b", config_fingerprint="f",
                            created_at=created, bfcl=None, tau2=None, trajectory_means={k: v for k, v in (("TAC", tac), ("LCF", lcf)) if v is not None},
                            settings={"template_mode": "native"})


def test_compare_reports_tolerances():
    deployed = _rep("d", 0.8, 0.1)
    assert compare_reports(_rep("c", 0.76, 0.14), deployed)["passed"]
    out = compare_reports(_rep("c", 0.70, 0.1), deployed)
    assert not out["passed"] and "TAC fell from 0.800 to 0.700" in out["reasons"][0]
    out = compare_reports(_rep("c", 0.9, 0.3), deployed)
    assert not out["passed"] and "LCF rose" in out["reasons"][0]
    assert compare_reports(_rep("c", None, 0.1), deployed)["missing"] == ["TAC"]


def test_reports_round_trip_through_the_warehouse(tmp_path):
    from agenttune_lib.warehouse import Warehouse

    wh = Warehouse(tmp_path / "w.duckdb")
    assert latest_report(wh, "a") is None
    write_report(wh, _rep("a", 0.5, 0.0, "2026-01-01T00:00:00+00:00", "r1"))
    write_report(wh, _rep("a", 0.6, 0.0, "2026-01-02T00:00:00+00:00", "r2"))
    write_report(wh, _rep("a", 0.6, 0.0, "2026-01-02T00:00:00+00:00", "r2"))  # idempotent
    got = latest_report(wh, "a")
    assert got.report_id == "r2" and got.trajectory_means == {"TAC": 0.6, "LCF": 0.0} and got.settings["template_mode"] == "native"
    assert wh.execute("SELECT count(*), max(tac) FROM evaluation_reports") == [(2, 0.6)]


def test_pending_targets_names_bad_adapters(tmp_path):
    import datetime as dt

    import pyarrow as pa

    from agenttune_lib.evaluation.pipeline import pending_targets
    from agenttune_lib.warehouse import Warehouse

    wh = Warehouse(tmp_path / "w.duckdb")
    cfg = EvaluationConfig()
    assert [t.model_kind for t in pending_targets(wh, "base:m", "/m", cfg)] == ["base"]
    with pytest.raises(KeyError, match="ghost"):
        pending_targets(wh, "base:m", "/m", cfg, adapter_ids=["ghost"])
    wh.upsert_arrow("adapters", pa.table({"adapter_id": ["a1"], "path": [str(tmp_path / "nope")],
                                          "created_at": pa.array([dt.datetime.now(dt.timezone.utc)], pa.timestamp("us", tz="UTC"))}), key="adapter_id")
    with pytest.raises(FileNotFoundError, match="a1"):
        pending_targets(wh, "base:m", "/m", cfg)
    (tmp_path / "nope").mkdir()
    (tmp_path / "nope" / "adapter_config.json").write_text("{}")
    targets = pending_targets(wh, "base:m", "/m", cfg)
    assert [(t.adapter_id, t.model_kind) for t in targets] == [("base:m", "base"), ("a1", "adapter")]
    import dataclasses

    write_report(wh, dataclasses.replace(_rep("a1", 0.5, 0.0, rid="ra1"), config_fingerprint=cfg.fingerprint()))
    assert [t.adapter_id for t in pending_targets(wh, "base:m", "/m", cfg)] == ["base:m"]  # a1 already reported under this config
