"""Model metrics: text overlap, perplexity, KL, entropy, preference and DPO metrics; missing libraries raise."""
import math

import pytest

from agenttune_lib.evaluation.metrics import BleuMetric, ExactMatchMetric, Metric, MetricDependencyError, RougeMetric
from agenttune_lib.evaluation.rl import RLEvaluator, detect_columns


@pytest.fixture(scope="module")
def models():
    from agenttune_lib.models.tiny import build_tiny_model

    policy, tok = build_tiny_model(seed=0)
    ref, _ = build_tiny_model(seed=1)
    return policy.eval(), ref.eval(), tok


def test_rouge_and_bleu_known_values():
    assert RougeMetric().compute(["the cat sat"], ["the cat sat"])["rougeL"] == pytest.approx(1.0)
    assert RougeMetric(types=("rouge1",)).compute(["the cat"], ["the dog"])["rouge1"] == pytest.approx(0.5)
    assert BleuMetric().compute(["the cat sat on the mat"], ["the cat sat on the mat"])["bleu"] == pytest.approx(100.0)
    assert BleuMetric().compute(["a b c d"], [["w x y z", "a b c d"]])["bleu"] == pytest.approx(100.0)
    assert ExactMatchMetric().compute([" Yes", "no"], ["yes", "maybe"]) == {"exact_match": 0.5}


def test_missing_library_raises_with_install_hint(monkeypatch):
    import sys

    for mod in ("rouge_score", "rouge_score.rouge_scorer", "sacrebleu"):
        monkeypatch.setitem(sys.modules, mod, None)  # import of a None entry raises ImportError
    with pytest.raises(MetricDependencyError, match="pip install rouge-score"):
        RougeMetric().compute(["a"], ["a"])
    with pytest.raises(MetricDependencyError, match="pip install sacrebleu"):
        BleuMetric().safe_compute(["a"], ["a"])  # safe_compute does not hide a missing library


def test_safe_compute_reports_a_failed_batch():
    class Boom(Metric):
        name = "boom"

        def compute(self, predictions, references):
            raise RuntimeError("bad batch")

    out = Boom().safe_compute(["a"], ["b"])
    assert out == {"boom_error": "RuntimeError: bad batch", "boom_failed": 1.0}
    assert "rouge_error" in RougeMetric().safe_compute(["a", "b"], ["a"])  # length mismatch is explicit


def test_detect_columns():
    assert detect_columns([{"question": "q", "answer": "a"}]) == ("question", "answer")
    assert detect_columns([{"prompt": "q", "chosen": "a", "rejected": "b"}]) == ("prompt", "chosen")
    with pytest.raises(ValueError, match="prompt column"):
        detect_columns([{"foo": 1}])
    with pytest.raises(ValueError, match="target_column='nope'"):
        detect_columns([{"prompt": 1}], target_column="nope")


def test_perplexity_matches_the_models_own_loss(models):
    import torch

    policy, _, tok = models
    ev = RLEvaluator(policy, tok)
    prompt, completion = "The answer is", " 4."
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    c_ids = tok(completion, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p_ids + c_ids])
    labels = ids.clone()
    labels[0, : len(p_ids)] = -100
    with torch.no_grad():
        loss = policy(input_ids=ids, labels=labels).loss
    assert ev.perplexity([prompt], [completion]) == pytest.approx(math.exp(float(loss)), rel=1e-4)


def test_kl_entropy_and_dpo(models):
    policy, ref, tok = models
    same = RLEvaluator(policy, tok, ref_model=policy)
    diff = RLEvaluator(policy, tok, ref_model=ref)
    prompts, comps = ["search the contract"], [" termination clause"]
    assert same.kl_divergence(prompts, comps) == pytest.approx(0.0, abs=1e-6)
    assert diff.kl_divergence(prompts, comps) > 1e-4
    h = same.policy_entropy(prompts, comps)
    assert 0.0 < h <= math.log(len(tok)) + 1e-6
    pairs = [{"prompt": "2 + 2 =", "chosen": " 4", "rejected": " 5"}]
    dpo_same = same.dpo_implicit_rewards(pairs)
    assert dpo_same["dpo_reward_margin"] == pytest.approx(0.0, abs=1e-6)
    dpo = diff.dpo_implicit_rewards(pairs)
    lp = diff.sequence_logprob("2 + 2 =", " 4", policy) - diff.sequence_logprob("2 + 2 =", " 4", ref)
    assert dpo["dpo_chosen_reward"] == pytest.approx(0.1 * lp, rel=1e-5)


def test_reward_metrics_and_full_evaluate(models):
    policy, ref, tok = models
    reward = lambda prompt, completion: float(len(completion))  # noqa: E731
    ev = RLEvaluator(policy, tok, ref_model=ref, reward_fn=reward, generate=lambda p: "yes it is")
    rows = [
        {"prompt": "a", "answer": "yes", "chosen": "long answer", "rejected": "no"},
        {"prompt": "b", "answer": "yes it is longer", "chosen": "x", "rejected": "yy"},
    ]
    pm = ev.preference_metrics(rows)
    assert pm == {"reward_margin": pytest.approx((9 - 1) / 2), "preference_accuracy": 0.5}
    assert ev.win_rate(["a", "b", "c"], ["aa", "b", "c"], ["a", "bb", "c"]) == pytest.approx(0.5)
    out = ev.evaluate(rows, target_column="answer")
    assert out["n"] == 2 and out["target_column"] == "answer"
    for key in ("rouge1", "bleu", "perplexity", "policy_entropy", "kl_divergence", "win_rate", "reward_margin", "dpo_reward_margin"):
        assert key in out, key
    assert out["win_rate"] == 0.5  # "yes it is" beats "yes", loses to "yes it is longer"


def test_needs_named_parts():
    with pytest.raises(ValueError, match="reward_fn"):
        RLEvaluator().win_rate(["a"], ["b"], ["c"])
    with pytest.raises(ValueError, match="model and a tokenizer"):
        RLEvaluator().perplexity(["a"], ["b"])
