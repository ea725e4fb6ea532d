"""The DeploymentGate on real suites with a tiny model: approve a candidate that improves its target (QA valid_call)
with no guard regression, refuse one that regresses a guard (BFCL irrelevance), and never let a later report
without a guard suite hide an earlier report's regression (the gate reads every report of the candidate).

The base is a random-init tiny model, which never emits a parseable tool call. The candidate is that model fully
fine-tuned (a few dozen AdamW steps) to answer every prompt with one search call: on the real QA suite a valid_call
gain, on BFCL simple_python no change (a search call is not the asked function, nor is the base's text), and on
BFCL irrelevance a real loss (the right answer there is no call). Both decode alike, so their configs pair.
"""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # four paired suite runs on the tiny model: minutes under load

from agenttune_lib.closed_loop.criteria import SuiteCriterion
from agenttune_lib.closed_loop.gate import DeploymentGate, GateConfig
from agenttune_lib.evaluation.compare import EvalRunConfig, ModelSpec, run_comparison
from agenttune_lib.evaluation.store import candidate_comparisons
from agenttune_lib.evaluation.suites import BFCLSuiteConfig, QASuiteConfig
from agenttune_lib.warehouse import Warehouse

N_QA, N_BFCL = 24, 20
TARGETS = {"distill": (SuiteCriterion("qa", "valid_call", 0.0, 20),)}
SIMPLE = SuiteCriterion("bfcl_platform", "score:simple_python", 0.15, N_BFCL)
IRRELEVANCE = SuiteCriterion("bfcl_platform", "score:irrelevance", 0.15, N_BFCL)
CALL = '<tool_call>{"name": "search_corpus", "arguments": {"query": "town"}}</tool_call>'


def _suite_prompts(policy, qa_index) -> list:
    """The conversations the QA and BFCL suites send a model (QA on other questions than the held-out ones)."""
    from agenttune_lib.evaluation.suites import run_bfcl_suite, run_qa_suite

    seen: list = []
    generate = policy.generate_batch

    def record(conversations, tools=None):
        seen.extend(list(c) for c in conversations)
        return generate(conversations, tools)

    policy.generate_batch = record
    tool, items = qa_index
    others = [{**it, "qa_id": f"t{i}", "question": f"Who made the {it['question'].split()[3]}?"} for i, it in enumerate(items[:8])]
    run_qa_suite(policy, others, tool, QASuiteConfig(max_steps=2))
    run_bfcl_suite(policy, BFCLSuiteConfig(categories=("simple_python", "irrelevance"), limit=4, arms=("platform",), sample_seed=7))
    return seen


@pytest.fixture(scope="module")
def models(tmp_path_factory, qa_index):
    """(base spec, candidate spec): the tiny model, and a copy of it fully fine-tuned to answer the suites' prompts with one search call."""
    import torch

    from agenttune_lib.evaluation.batched import BatchedChatPolicy
    from agenttune_lib.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("models")
    model, tok = build_tiny_model()
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    rows = []
    for conv in _suite_prompts(BatchedChatPolicy(model, tok, max_new_tokens=4), qa_index):
        p_ids = tok(tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
        c_ids = tok(CALL + tok.eos_token, add_special_tokens=False)["input_ids"]
        rows.append((torch.tensor([p_ids + c_ids]), torch.tensor([[-100] * len(p_ids) + c_ids])))
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for step in range(20 * len(rows)):
        ids, labels = rows[step % len(rows)]
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-len(rows):]) / len(rows) < 0.05, losses[-len(rows):]
    model.eval()
    model.save_pretrained(root / "cand")
    tok.save_pretrained(root / "cand")
    return ModelSpec("base:tiny", str(root / "base")), ModelSpec("cand-1", str(root / "cand"))


@pytest.fixture(scope="module")
def qa_index(tmp_path_factory):
    """A BM25 index of N_QA one-fact passages and their questions."""
    from agenttune_lib.rag import SearchCorpusTool, load_backend
    from agenttune_lib.rag.backends import build_index
    from agenttune_lib.rag.chunking import Chunk

    root = tmp_path_factory.mktemp("qa")
    names = [f"item{i}" for i in range(N_QA)]
    chunks = [Chunk(f"c{i}", f"d{i}", 0, f"The {n} was built in town number {i} by guild {i % 5}.", title=n) for i, n in enumerate(names)]
    build_index(chunks, root / "idx", kinds=("bm25",))
    items = [{"qa_id": f"q{i}", "question": f"Where was the {n} built?", "answer": f"town number {i}", "gold_chunk_ids": [f"c{i}"], "hops": 1}
             for i, n in enumerate(names)]
    return SearchCorpusTool(load_backend(root / "idx", "bm25"), k=2), items


def _qa_report(wh, models, qa_index):
    tool, items = qa_index
    cfg = EvalRunConfig(qa=QASuiteConfig(max_steps=2), qa_limit=N_QA, tau2=None, bfcl=None, max_new_tokens=48, batch_size=8)
    return run_comparison(wh, *models, cfg, qa_items=items, search_tool=tool, reuse_base=False)


def _bfcl_report(wh, models, category):
    cfg = EvalRunConfig(qa=None, tau2=None, bfcl=BFCLSuiteConfig(categories=(category,), limit=N_BFCL, arms=("platform",)),
                        max_new_tokens=48, batch_size=8)
    return run_comparison(wh, *models, cfg, reuse_base=False)


def _gate(wh, models, guards):
    gate = DeploymentGate(GateConfig(require_trajectory_arm=False, targets=TARGETS, guards=guards))
    cand = models[1].model_id
    return gate.evaluate_decision(replay_old=[], replay_new=[], comparisons=candidate_comparisons(wh, cand), candidate=cand, candidate_kind="distill")


def _row(report, suite, metric):
    return next(c for c in report.comparisons[suite] if c.metric == metric)


def test_gate_approves_a_target_gain_without_guard_regression(tmp_path, models, qa_index):
    wh = Warehouse(tmp_path / "wh.duckdb")
    qa = _qa_report(wh, models, qa_index)
    assert (_row(qa, "qa", "valid_call").base_mean, _row(qa, "qa", "valid_call").candidate_mean) == (0.0, 1.0)
    simple = _row(_bfcl_report(wh, models, "simple_python"), "bfcl_platform", "score:simple_python")
    assert simple.n == N_BFCL and simple.base_mean == simple.candidate_mean == 0.0
    decision = _gate(wh, models, guards=(SIMPLE,))
    assert decision.approved, decision.reasons
    (target,) = decision.arms["targets"]["criteria"]
    assert target["criterion"] == "qa/valid_call" and target["n"] == N_QA and target["lower_bound"] == pytest.approx(1.0 - 3 / N_QA)
    (guard,) = decision.arms["guards"]["criteria"]
    assert guard["criterion"] == "bfcl_platform/score:simple_python" and guard["lower_bound"] == pytest.approx(-3 / N_BFCL)


def test_gate_refuses_a_guard_regression_even_when_a_later_report_lacks_the_guard(tmp_path, models, qa_index):
    wh = Warehouse(tmp_path / "wh.duckdb")
    irr = _row(_bfcl_report(wh, models, "irrelevance"), "bfcl_platform", "score:irrelevance")  # earlier report
    assert irr.base_mean == 1.0 and irr.candidate_mean <= 0.1  # it now calls a tool where none fits
    _qa_report(wh, models, qa_index)  # later report: QA only, no BFCL rows
    decision = _gate(wh, models, guards=(IRRELEVANCE,))
    assert not decision.approved
    assert decision.arms["targets"]["passed"]
    (guard,) = decision.arms["guards"]["criteria"]
    assert guard["lower_bound"] < -0.5 and guard["report_id"] != decision.arms["targets"]["criteria"][0]["report_id"]
    assert decision.reasons == [
        f"guards: guard bfcl_platform/score:irrelevance: 1.000 -> {irr.candidate_mean:.3f}, diff {irr.diff:+.3f} "
        f"[{irr.ci_low:+.3f}, {irr.ci_high:+.3f}], n={N_BFCL}; lower bound {guard['lower_bound']:+.3f} is below the non-inferiority margin -0.150"
    ]
    # No guard suite stored at all: the refusal names the missing suite.
    empty = Warehouse(tmp_path / "empty.duckdb")
    _qa_report(empty, models, qa_index)
    missing = _gate(empty, models, guards=(IRRELEVANCE,))
    assert missing.reasons == ["guards: guard bfcl_platform/score:irrelevance: no paired held-out comparison for the candidate"]
