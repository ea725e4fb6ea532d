"""run_comparison end to end on a tiny model: rows and comparisons stored, identical models tie, the structured-decoding
arm is reported as its own suites and only ever emits valid calls or plain text."""
import pytest

from agenttune_lib.evaluation.batched import BatchedChatPolicy
from agenttune_lib.evaluation.compare import EvalRunConfig, ModelSpec, comparison_table, plot_comparison, run_comparison
from agenttune_lib.evaluation.store import latest_comparisons
from agenttune_lib.evaluation.suites import BFCLSuiteConfig, QASuiteConfig

pytest.importorskip("xgrammar")


@pytest.mark.slow
def test_identical_models_tie_and_constrained_arm_is_separate(tmp_path, warehouse, tiny_model):
    from test_eval_suites import _qa_index

    model, tok = tiny_model
    tool, items = _qa_index(tmp_path)
    cfg = EvalRunConfig(qa=QASuiteConfig(max_steps=2), qa_limit=None, tau2=None, max_new_tokens=16, constrained_arm=True,
                        bfcl=BFCLSuiteConfig(categories=("simple_python", "irrelevance"), limit=2, arms=("platform",)), n_resamples=200)
    load = lambda spec: BatchedChatPolicy(model, tok, max_new_tokens=16, batch_size=8)  # noqa: E731  same weights for both
    rep = run_comparison(warehouse, ModelSpec("base:tiny", "-"), ModelSpec("tiny-copy", "-"), cfg, qa_items=items, search_tool=tool, load_policy=load)
    assert set(rep.results) == {"qa", "qa+constrained", "bfcl_platform", "bfcl_constrained"}
    assert all(c.ci_low <= 0 <= c.ci_high and c.diff == 0 for comps in rep.comparisons.values() for c in comps)
    stored = latest_comparisons(warehouse, "tiny-copy")
    assert {r["suite"] for r in stored} == set(rep.results) and all(r["report_id"] == rep.report_id for r in stored)
    # structured decoding: any tool call the constrained arm made is a valid call of the offered tool
    for r in rep.results["qa+constrained"]["candidate"].rows:
        assert r["metrics"]["TAC"] in (None, 1.0) and r["metrics"]["tool_errors"] == 0 or r["metrics"]["tool_calls"] == 0
    assert rep.results["qa+constrained"]["base"].config_hash != rep.results["qa"]["base"].config_hash
    table = {row["suite"]: row for row in comparison_table(rep)}
    assert table["qa"]["n"] == 4 and table["qa"]["mde"] > 0
    assert plot_comparison(rep, tmp_path / "p.png").stat().st_size > 1000


def test_the_evaluation_dtype_is_resolved_checked_and_part_of_the_config(tmp_path):
    import torch

    from agenttune_lib.evaluation.batched import load_policy, resolve_eval_dtype
    from agenttune_lib.models.tiny import save_tiny_model

    assert resolve_eval_dtype("auto") in ("float32", "bfloat16")
    assert resolve_eval_dtype("bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="float16"):
        resolve_eval_dtype("float16")
    with pytest.raises(ValueError, match="resolve 'auto' first"):
        EvalRunConfig(dtype="auto")
    # Reports made in bf16 and fp32 never share a config (so base rows are never reused across them).
    assert EvalRunConfig(dtype="bfloat16").fingerprint() != EvalRunConfig().fingerprint()
    assert EvalRunConfig(dtype="bfloat16").decoding()["dtype"] == "bfloat16"

    base = save_tiny_model(tmp_path / "tiny")
    policy = load_policy(str(base), dtype="bfloat16", max_new_tokens=4)
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    gen = policy([{"role": "user", "content": "hello"}])
    assert 1 <= len(gen.completion_ids) <= 4
