"""Model metrics over a dataset: text overlap, perplexity, KL to a reference, entropy, preference and DPO metrics."""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agenttune_lib.evaluation.metrics import BleuMetric, Metric, RougeMetric, require

__all__ = ["RLEvaluator", "detect_columns", "rows_of"]

PROMPT_COLUMNS = ("prompt", "question", "query", "input", "instruction", "task")
TARGET_COLUMNS = ("completion", "answer", "target", "reference", "response", "output", "label", "chosen")


def rows_of(dataset: Any) -> list[dict[str, Any]]:
    """A list of dict rows from a list of mappings, a Hugging Face ``Dataset`` or a pandas DataFrame."""
    if hasattr(dataset, "to_dict") and hasattr(dataset, "columns") and not isinstance(dataset, Mapping):
        return list(dataset.to_dict("records"))
    if isinstance(dataset, Mapping):
        raise TypeError("dataset must be a sequence of rows, got a single mapping")
    rows = [dict(r) for r in dataset]
    for i, r in enumerate(rows):
        if not r:
            raise ValueError(f"dataset row {i} is empty")
    return rows


def detect_columns(rows: Sequence[Mapping[str, Any]], prompt_column: str | None = None, target_column: str | None = None) -> tuple[str, str | None]:
    """(prompt column, target column or None) by the usual names, or the ones given (checked to exist)."""
    if not rows:
        raise ValueError("dataset is empty")
    keys = set(rows[0])
    for given, what in ((prompt_column, "prompt_column"), (target_column, "target_column")):
        if given is not None and given not in keys:
            raise ValueError(f"{what}={given!r} is not a dataset column; columns: {sorted(keys)}")
    prompt = prompt_column or next((c for c in PROMPT_COLUMNS if c in keys), None)
    if prompt is None:
        raise ValueError(f"no prompt column found among {sorted(keys)}; pass prompt_column (tried {PROMPT_COLUMNS})")
    target = target_column or next((c for c in TARGET_COLUMNS if c in keys and c != prompt), None)
    return prompt, target


def _text(value: Any) -> str:
    if isinstance(value, list) and value and isinstance(value[0], Mapping):  # chat messages: last content
        return str(value[-1].get("content", ""))
    return "" if value is None else str(value)


class RLEvaluator:
    """Drives generation over a dataset and computes model metrics; model, reference, generator and reward are injected.

    ``model``/``tokenizer`` are a transformers causal LM (for perplexity, entropy, KL, DPO);
    ``ref_model`` the reference policy (KL, DPO); ``generate(prompt) -> text`` produces
    predictions (defaults to greedy decoding with ``model``); ``reward_fn(prompt, completion)
    -> float`` scores completions (win rate, reward margin, preference accuracy).
    """

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        ref_model: Any = None,
        generate: Callable[[str], str] | None = None,
        reward_fn: Callable[[str, str], float] | None = None,
        metrics: Sequence[Metric] | None = None,
        beta: float = 0.1,
        max_new_tokens: int = 64,
    ) -> None:
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        self.model, self.tokenizer, self.ref_model = model, tokenizer, ref_model
        self._generate = generate
        self.reward_fn = reward_fn
        self.metrics = list(metrics) if metrics is not None else [RougeMetric(), BleuMetric()]
        self.beta = beta
        self.max_new_tokens = max_new_tokens

    # -- generation ------------------------------------------------------------
    def generate(self, prompt: str) -> str:
        """One prediction: the injected generator, else greedy decoding with ``model``."""
        if self._generate is not None:
            return self._generate(prompt)
        torch = require("torch", "torch==2.13.0", "RLEvaluator.generate")
        self._need_model("generate")
        ids = self.tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            out = self.model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

    def _need_model(self, what: str, ref: bool = False) -> None:
        if self.model is None or self.tokenizer is None:
            raise ValueError(f"{what} needs a model and a tokenizer; RLEvaluator was built without them")
        if ref and self.ref_model is None:
            raise ValueError(f"{what} needs ref_model (the reference policy)")

    # -- token-level quantities --------------------------------------------------
    def _ids(self, prompt: str, completion: str) -> tuple[list[int], int]:
        tok = self.tokenizer
        p = list(tok(prompt, add_special_tokens=False)["input_ids"]) if prompt else []
        if not p:
            start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
            p = [start] if start is not None else []
        c = list(tok(completion, add_special_tokens=False)["input_ids"])
        if not c:
            raise ValueError(f"completion {completion!r} has no tokens")
        if not p:
            raise ValueError("tokenizer has no BOS/EOS token to condition an empty prompt on")
        return p + c, len(p)

    def _completion_logprobs(self, model: Any, prompt: str, completion: str) -> Any:
        """Log-softmax over the vocabulary at each completion position, and the completion token ids."""
        torch = require("torch", "torch==2.13.0", "RLEvaluator")
        ids, n_prompt = self._ids(prompt, completion)
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(input_ids=x).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)[n_prompt - 1:]
        return logp, x[0, n_prompt:]

    def sequence_logprob(self, prompt: str, completion: str, model: Any = None) -> float:
        """Sum of log p(completion tokens | prompt) under ``model`` (the policy by default)."""
        self._need_model("sequence_logprob")
        logp, target = self._completion_logprobs(model or self.model, prompt, completion)
        return float(logp.gather(1, target[:, None]).sum())

    def perplexity(self, prompts: Sequence[str], completions: Sequence[str]) -> float:
        """exp of the mean negative log-likelihood per completion token, pooled over the dataset."""
        self._need_model("perplexity")
        nll, n = 0.0, 0
        for p, c in zip(prompts, completions, strict=True):
            logp, target = self._completion_logprobs(self.model, p, c)
            nll -= float(logp.gather(1, target[:, None]).sum())
            n += int(target.numel())
        return math.exp(nll / n)

    def kl_divergence(self, prompts: Sequence[str], completions: Sequence[str]) -> float:
        """Mean over completion positions of KL(policy || reference), exact over the vocabulary."""
        self._need_model("kl_divergence", ref=True)
        total, n = 0.0, 0
        for p, c in zip(prompts, completions, strict=True):
            lp, _ = self._completion_logprobs(self.model, p, c)
            lq, _ = self._completion_logprobs(self.ref_model, p, c)
            total += float((lp.exp() * (lp - lq)).sum())
            n += lp.shape[0]
        return total / n

    def policy_entropy(self, prompts: Sequence[str], completions: Sequence[str]) -> float:
        """Mean token entropy (nats) of the policy's next-token distribution over completion positions."""
        self._need_model("policy_entropy")
        total, n = 0.0, 0
        for p, c in zip(prompts, completions, strict=True):
            lp, _ = self._completion_logprobs(self.model, p, c)
            total += float(-(lp.exp() * lp).sum())
            n += lp.shape[0]
        return total / n

    # -- reward-based metrics ------------------------------------------------------
    def _reward(self, prompt: str, completion: str) -> float:
        if self.reward_fn is None:
            raise ValueError("this metric needs reward_fn(prompt, completion) -> float")
        value = float(self.reward_fn(prompt, completion))
        if math.isnan(value):
            raise ValueError(f"reward_fn returned NaN for prompt {prompt[:60]!r}")
        return value

    def win_rate(self, prompts: Sequence[str], predictions: Sequence[str], baselines: Sequence[str]) -> float:
        """Share of items where the prediction out-scores the baseline under ``reward_fn`` (ties count half)."""
        wins = []
        for p, a, b in zip(prompts, predictions, baselines, strict=True):
            ra, rb = self._reward(p, a), self._reward(p, b)
            wins.append(1.0 if ra > rb else 0.5 if ra == rb else 0.0)
        return statistics.fmean(wins)

    def preference_metrics(self, dataset: Iterable[Mapping[str, Any]]) -> dict[str, float]:
        """``reward_margin`` (mean r(chosen) - r(rejected)) and ``preference_accuracy`` (share with chosen > rejected)."""
        rows = rows_of(dataset)
        prompt_col, _ = detect_columns(rows)
        margins = []
        for i, r in enumerate(rows):
            if "chosen" not in r or "rejected" not in r:
                raise ValueError(f"preference row {i} needs 'chosen' and 'rejected'; has {sorted(r)}")
            p = _text(r[prompt_col])
            margins.append(self._reward(p, _text(r["chosen"])) - self._reward(p, _text(r["rejected"])))
        return {"reward_margin": statistics.fmean(margins), "preference_accuracy": sum(m > 0 for m in margins) / len(margins)}

    def dpo_implicit_rewards(self, dataset: Iterable[Mapping[str, Any]]) -> dict[str, float]:
        """DPO's implicit reward ``beta * (log pi(y|x) - log pi_ref(y|x))`` for chosen and rejected; no reward model.

        Returns the mean chosen and rejected rewards, their margin, and the share of pairs whose
        chosen reward is higher (DPO's ``rewards/accuracies``).
        """
        self._need_model("dpo_implicit_rewards", ref=True)
        rows = rows_of(dataset)
        prompt_col, _ = detect_columns(rows)
        chosen, rejected = [], []
        for i, r in enumerate(rows):
            if "chosen" not in r or "rejected" not in r:
                raise ValueError(f"preference row {i} needs 'chosen' and 'rejected'; has {sorted(r)}")
            p = _text(r[prompt_col])
            for col, out in (("chosen", chosen), ("rejected", rejected)):
                y = _text(r[col])
                out.append(self.beta * (self.sequence_logprob(p, y, self.model) - self.sequence_logprob(p, y, self.ref_model)))
        margins = [c - j for c, j in zip(chosen, rejected)]
        return {
            "dpo_chosen_reward": statistics.fmean(chosen),
            "dpo_rejected_reward": statistics.fmean(rejected),
            "dpo_reward_margin": statistics.fmean(margins),
            "dpo_reward_accuracy": sum(m > 0 for m in margins) / len(margins),
        }

    # -- the whole dataset ---------------------------------------------------------
    def evaluate(
        self,
        dataset: Any,
        predictions: Sequence[str] | None = None,
        prompt_column: str | None = None,
        target_column: str | None = None,
    ) -> dict[str, Any]:
        """Every metric the injected parts allow, over ``dataset`` (predictions generated unless given).

        Text metrics need a target column; perplexity, entropy and KL are measured on the
        predictions; win rate compares predictions with targets under ``reward_fn``; preference
        and DPO metrics run when rows carry ``chosen`` and ``rejected``.
        """
        rows = rows_of(dataset)
        pcol, tcol = detect_columns(rows, prompt_column, target_column)
        prompts = [_text(r[pcol]) for r in rows]
        preds = list(predictions) if predictions is not None else [self.generate(p) for p in prompts]
        if len(preds) != len(rows):
            raise ValueError(f"{len(preds)} predictions for {len(rows)} rows")
        out: dict[str, Any] = {"n": len(rows), "prompt_column": pcol, "target_column": tcol}
        if tcol is not None:
            refs = [_text(r[tcol]) for r in rows]
            for metric in self.metrics:
                out.update(metric.safe_compute(preds, refs))
        scored = [(p, c) for p, c in zip(prompts, preds) if c.strip()]
        if self.model is not None and self.tokenizer is not None and scored:
            ps, cs = zip(*scored)
            out["perplexity"] = self.perplexity(ps, cs)
            out["policy_entropy"] = self.policy_entropy(ps, cs)
            if self.ref_model is not None:
                out["kl_divergence"] = self.kl_divergence(ps, cs)
        if self.reward_fn is not None and tcol is not None:
            out["win_rate"] = self.win_rate(prompts, preds, [_text(r[tcol]) for r in rows])
        if all("chosen" in r and "rejected" in r for r in rows):
            if self.reward_fn is not None:
                out.update(self.preference_metrics(rows))
            if self.model is not None and self.ref_model is not None:
                out.update(self.dpo_implicit_rewards(rows))
        return out
