"""LLMJudge (absolute and relative scoring with an injected model) and the RuleGuardCombinator clamp.

The judge's model is injected: any callable ``prompt -> text``, a local transformers model
(``TransformersJudgeModel``) or an OpenAI-compatible endpoint (``OpenAICompatibleModel``).
A reply the judge cannot parse raises JudgeError; it never scores zero in its place.
"""
from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.rl.rewards._text import content_words, final_answer, full_text, tool_results

__all__ = ["LLMJudge", "JudgeError", "RuleGuardCombinator", "TransformersJudgeModel", "OpenAICompatibleModel", "ABSOLUTE_PROMPTS", "RELATIVE_PROMPTS"]


class JudgeError(RuntimeError):
    """The judge's model failed or replied with something that is not a score."""


ABSOLUTE_PROMPTS = (
    "You are grading an AI agent.\nTask: {task}\nCriteria: {criteria}\nAgent trajectory:\n{trajectory}\n\n"
    "Reply with one line 'SCORE: x' where x is a number from 0 to 10.",
    "Evaluate how well the response satisfies the criteria.\nCriteria: {criteria}\nTask: {task}\nResponse:\n{trajectory}\n\n"
    "Give your verdict as 'SCORE: x' (0 = fails completely, 10 = fully satisfies).",
    "Act as a strict reviewer. Read the task and the agent's work, then rate it against: {criteria}.\n"
    "TASK: {task}\nWORK:\n{trajectory}\nAnswer only with 'SCORE: x', x between 0 and 10.",
)

RELATIVE_PROMPTS = (
    "You are comparing {n} attempts at the same task.\nTask: {task}\nCriteria: {criteria}\n{candidates}\n\n"
    "Rank every attempt from best to worst with no ties. Reply with one line 'RANKING: i > j > ...' using the attempt numbers.",
    "Several agents tried this task: {task}\nJudge them by: {criteria}\n{candidates}\n\n"
    "Order all {n} attempts strictly from best to worst as 'RANKING: i > j > ...'.",
)


class TransformersJudgeModel:
    """A local transformers causal LM as a judge model (greedy, chat template)."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 32) -> None:
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens

    def __call__(self, prompt: str) -> str:
        import torch

        text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = self.model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


class OpenAICompatibleModel:
    """Any OpenAI-compatible chat-completions endpoint (vLLM server, Ollama, hosted APIs) via the standard library."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 60.0, temperature: float = 0.0) -> None:
        self.base_url, self.model, self.api_key, self.timeout_s, self.temperature = base_url.rstrip("/"), model, api_key, timeout_s, temperature

    def __call__(self, prompt: str) -> str:
        from agenttune_lib.models.openai_compat import EndpointError, chat_completion

        try:
            return chat_completion(
                self.base_url, self.model, [{"role": "user", "content": prompt}], api_key=self.api_key,
                temperature=self.temperature, timeout_s=self.timeout_s,
            ).text
        except EndpointError as exc:
            raise JudgeError(f"judge model {self.model}: {exc}") from exc


def _render(trajectory: Any) -> str:
    if isinstance(trajectory, str):
        return trajectory
    if hasattr(trajectory, "to_eval_dict"):
        d = trajectory.to_eval_dict()
        return json.dumps({"tool_calls": d["tool_calls"], "tool_outputs": d["tool_outputs"], "final_answer": d["final_answer"]}, default=str)
    return full_text(trajectory) + ("\n" + "\n".join(tool_results(trajectory)) if tool_results(trajectory) else "")


class LLMJudge:
    """Scores trajectories with an injected model: ``mode="absolute"`` one prompt each, ``"relative"`` all in one.

    Defenses: prompt rotation (a seeded random template per call), a score cache keyed by
    (task, trajectory, criteria, mode), and clamping when a trajectory over-retrieves
    (more than ``max_retrievals`` tool calls scores at most ``over_retrieval_cap``).
    """

    def __init__(
        self,
        model: Callable[[str], str],
        criteria: str = "correct, grounded in retrieved evidence, and concise",
        seed: int = 0,
        max_retrievals: int | None = None,
        over_retrieval_cap: float = 0.3,
        absolute_prompts: Sequence[str] = ABSOLUTE_PROMPTS,
        relative_prompts: Sequence[str] = RELATIVE_PROMPTS,
    ) -> None:
        if not callable(model):
            raise TypeError(f"LLMJudge model must be a callable prompt -> text, got {type(model).__name__}")
        self.model = model
        self.criteria = criteria
        self.rng = random.Random(seed)
        self.max_retrievals = max_retrievals
        self.over_retrieval_cap = over_retrieval_cap
        self.absolute_prompts = tuple(absolute_prompts)
        self.relative_prompts = tuple(relative_prompts)
        self.cache: dict[tuple[str, str, str, str], float] = {}
        self.calls = 0

    @classmethod
    def from_engine(cls, engine: Any, **kwargs: Any) -> "LLMJudge":
        """A judge that reuses an already-loaded rollout engine (transformers, vLLM or Ray) instead of a second model load."""
        if not hasattr(engine, "generate"):
            raise TypeError(f"{type(engine).__name__} has no generate(messages); pass a rollout engine")
        return cls(lambda prompt: engine.generate([{"role": "user", "content": prompt}])["text"], **kwargs)

    def _ask(self, prompt: str) -> str:
        self.calls += 1
        try:
            return str(self.model(prompt))
        except JudgeError:
            raise
        except Exception as exc:
            raise JudgeError(f"judge model failed: {type(exc).__name__}: {exc}") from exc

    def _clamp(self, score: float, trajectory: Any) -> float:
        if self.max_retrievals is None:
            return score
        from agenttune_lib.rl.rewards._text import tool_calls

        n = len(trajectory.filter("tool_call")) if hasattr(trajectory, "filter") else len(tool_calls(trajectory)[0]) if not isinstance(trajectory, str) else 0
        return min(score, self.over_retrieval_cap) if n > self.max_retrievals else score

    def evaluate(self, task: str, trajectory: Any, criteria: str | None = None) -> float:
        """One absolute score in [0, 1]."""
        return self.evaluate_batch(task, [trajectory], criteria, mode="absolute")[0]

    def evaluate_batch(self, task: str, trajectories: Sequence[Any], criteria: str | None = None, mode: str = "relative") -> list[float]:
        """Scores in [0, 1]; relative mode enforces a strict ranking (evenly spaced scores)."""
        if mode not in ("absolute", "relative"):
            raise ValueError(f"mode must be 'absolute' or 'relative', got {mode!r}")
        crit = criteria or self.criteria
        texts = [_render(t) for t in trajectories]
        if not texts:
            return []
        keys = [(task, t, crit, mode if len(texts) > 1 else "absolute") for t in texts]
        if all(k in self.cache for k in keys) and (mode == "absolute" or len(set(texts)) == len(texts)):
            return [self._clamp(self.cache[k], tr) for k, tr in zip(keys, trajectories)]
        if mode == "absolute" or len(texts) == 1:
            scores = []
            for key, text in zip(keys, texts):
                if key not in self.cache:
                    template = self.rng.choice(self.absolute_prompts)
                    self.cache[key] = self._parse_score(self._ask(template.format(task=task, criteria=crit, trajectory=text)))
                scores.append(self.cache[key])
        else:
            template = self.rng.choice(self.relative_prompts)
            candidates = "\n".join(f"Attempt {i + 1}:\n{t}" for i, t in enumerate(texts))
            order = self._parse_ranking(self._ask(template.format(task=task, criteria=crit, candidates=candidates, n=len(texts))), len(texts))
            n = len(texts)
            scores = [0.0] * n
            for rank, idx in enumerate(order):
                scores[idx] = 1.0 - rank / (n - 1)
            for key, s in zip(keys, scores):
                self.cache[key] = s
        return [self._clamp(s, tr) for s, tr in zip(scores, trajectories)]

    @staticmethod
    def _parse_score(reply: str) -> float:
        m = re.search(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", reply, re.I) or re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*", reply)
        if not m:
            raise JudgeError(f"judge reply has no 'SCORE: x': {reply[:200]!r}")
        value = float(m.group(1))
        if not 0.0 <= value <= 10.0:
            raise JudgeError(f"judge score {value} is outside 0..10")
        return value / 10.0

    @staticmethod
    def _parse_ranking(reply: str, n: int) -> list[int]:
        m = re.search(r"ranking\s*[:=]\s*([0-9>\s,]+)", reply, re.I)
        if not m:
            raise JudgeError(f"judge reply has no 'RANKING: i > j': {reply[:200]!r}")
        order = [int(x) - 1 for x in re.findall(r"\d+", m.group(1))]
        if sorted(order) != list(range(n)):
            raise JudgeError(f"judge ranking {order} is not a strict ranking of {n} attempts")
        return order

    def as_reward_fn(self, mode: str = "relative", task_key: str = "prompts") -> Callable[..., list[float]]:
        """A GRPO reward: each prompt's group of completions judged together (relative) or one by one."""

        def llm_judge_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
            prompts = kwargs.get(task_key) or [""] * len(completions)
            out = [0.0] * len(completions)
            groups: dict[str, list[int]] = {}
            for i, p in enumerate(prompts):
                groups.setdefault(json.dumps(p, sort_keys=True, default=str), []).append(i)
            for key, idx in groups.items():
                task = json.loads(key)
                task = task if isinstance(task, str) else full_text([m for m in task if m.get("role") == "user"] or task)
                for i, s in zip(idx, self.evaluate_batch(task, [completions[i] for i in idx], mode=mode)):
                    out[i] = s
            return out

        return llm_judge_reward


class RuleGuardCombinator:
    """Clamp a judge's score to at most ``cap`` (0.2) when the answer shares no vocabulary with the retrieved chunks."""

    def __init__(self, judge: Callable[..., list[float]] | LLMJudge, cap: float = 0.2) -> None:
        self.score_fn = judge.as_reward_fn() if isinstance(judge, LLMJudge) else judge
        self.cap = cap

    @staticmethod
    def grounded(completion: Any, retrieved: Any = None) -> bool:
        answer = content_words(final_answer(completion))
        chunks = content_words(" ".join(tool_results(completion, retrieved)))
        return bool(answer & chunks)

    def __call__(self, completions: Sequence[Any], retrieved: Any = None, **kwargs: Any) -> list[float]:
        from agenttune_lib.rl.rewards._text import per_item
        from agenttune_lib.rl.rewards.combine import call_reward

        scores = call_reward(self.score_fn, completions, retrieved=retrieved, **kwargs) if retrieved is not None else call_reward(self.score_fn, completions, **kwargs)
        docs = per_item({"r": retrieved}, "r", len(completions), False, "RuleGuardCombinator")
        return [s if self.grounded(c, r) else min(s, self.cap) for s, c, r in zip(scores, completions, docs)]

    @property
    def __name__(self) -> str:  # reward functions are named in TRL logs
        return "rule_guard"
