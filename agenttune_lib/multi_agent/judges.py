"""Judge nodes and the judge panel: duck-typed judges scoring multi-agent EventLogs, aggregated into one reward.

A judge is an ``LLMJudge`` (scored through ``evaluate``/``evaluate_batch``), any object with
``evaluate_trajectory(trajectory) -> float``, or a plain callable ``trajectory -> float``.
The panel keeps every judge's score and aggregates them by mean, median or weighted sum;
mean and weighted go through the RL core's ``combine_rewards``.
"""
from __future__ import annotations

import inspect
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agenttune_lib.events import EventKind, EventLog, render_tool_call

__all__ = ["AGGREGATES", "JudgeNodeError", "RewardJudge", "OverlapJudge", "AnswerJudge", "answer_score", "answer_tokens", "agent_text", "JudgeAdapter", "aggregate_scores", "episode_messages", "episode_task"]

AGGREGATES = ("mean", "median", "weighted")


def episode_task(log: EventLog) -> str:
    """The task an episode answers: its metadata task, else its first observation."""
    task = log.metadata.get("task")
    if isinstance(task, str):
        return task
    obs = log.filter(EventKind.OBSERVATION)
    return str(obs[0].payload.get("content", "")) if obs else ""


def episode_messages(log: EventLog, author: str | None = None) -> list[dict[str, Any]]:
    """Assistant and tool messages of an episode (of one ``author`` when given): the completion judges and rewards read."""
    out = []
    for ev in log.events:
        if author is not None and ev.author != author:
            continue
        if ev.kind is EventKind.TOOL_CALL:
            out.append({"role": "assistant", "content": render_tool_call(ev.payload)})
        elif ev.kind in (EventKind.TEXT, EventKind.REASONING):
            out.append({"role": "assistant", "content": str(ev.payload.get("content", ev.payload.get("text", "")))})
        elif ev.kind is EventKind.TOOL_RESULT:
            out.append({"role": "tool", "content": str(ev.payload.get("content", "")), "name": str(ev.payload.get("name", ""))})
    return out


class JudgeNodeError(RuntimeError):
    """A judge failed or returned something that is not a finite score; the message names the judge."""


class RewardJudge:
    """A REWARD_REGISTRY reward (or any GRPO reward callable) as a judge of whole episodes.

    Dataset-style columns come from the episode itself: ``answer`` from its metadata,
    ``tool_call_counts`` from its TOOL_CALL events, ``prompts`` from its task.
    """

    def __init__(self, reward: str | Callable[..., Any], **reward_kwargs: Any) -> None:
        from agenttune_lib.rl.rewards import resolve_reward

        self.reward = resolve_reward(reward)
        self.name = reward if isinstance(reward, str) else getattr(reward, "__name__", type(reward).__name__)
        self.reward_kwargs = reward_kwargs

    def evaluate_trajectory(self, trajectory: EventLog) -> float:
        from agenttune_lib.rl.rewards import call_reward

        kwargs = dict(self.reward_kwargs)
        if trajectory.metadata.get("answer") is not None:
            kwargs.setdefault("answer", [str(trajectory.metadata["answer"])])
        kwargs.setdefault("tool_call_counts", [len(trajectory.filter(EventKind.TOOL_CALL))])
        kwargs.setdefault("prompts", [episode_task(trajectory)])
        return call_reward(self.reward, [episode_messages(trajectory)], **kwargs)[0]

    def __repr__(self) -> str:
        return f"RewardJudge({self.name!r})"


def agent_text(log: EventLog, author: str | None = None) -> str:
    """The text one agent (default: the episode's trained agent, else every agent) wrote in an episode."""
    who = author or log.metadata.get("token_agent")
    evs = [e for e in log.filter(EventKind.TEXT) if who is None or e.author == who]
    return "\n".join(str(e.payload.get("content", "")) for e in evs)


class OverlapJudge:
    """Content-word F1 between the trained agent's text and a reference: the task, or another agent's text.

    A cheap, answer-free judge that varies with what the agent writes: ``reference="task"``
    scores staying on the task, ``reference="<agent>"`` scores using a teammate's output.
    It measures topicality, not correctness: it cannot tell "Paris." from junk (both 0 against
    "What is the capital of France?"); where tasks carry reference answers use AnswerJudge.
    """

    def __init__(self, reference: str = "task", author: str | None = None, penalize_copy: bool = False) -> None:
        self.reference, self.author, self.penalize_copy = reference, author, penalize_copy

    def evaluate_trajectory(self, trajectory: EventLog) -> float:
        from agenttune_lib.rl.rewards._text import content_words

        ref_text = episode_task(trajectory) if self.reference == "task" else agent_text(trajectory, self.reference)
        ref, got = content_words(ref_text), content_words(agent_text(trajectory, self.author))
        common = len(ref & got)
        if not ref or not got or not common:
            return 0.0
        precision, recall = common / len(got), common / len(ref)
        f1 = 2 * precision * recall / (precision + recall)
        if self.penalize_copy:
            # Parroting the task maximises overlap while saying nothing: scale by the share of new words.
            f1 *= len(got - content_words(episode_task(trajectory))) / len(got)
        return f1

    def __repr__(self) -> str:
        return f"OverlapJudge(reference={self.reference!r})"


_PUNCT = re.compile(r"[^\w\s]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def answer_tokens(text: str) -> list[str]:
    """SQuAD-style normalised tokens: lower case, punctuation and articles removed."""
    return _ARTICLES.sub(" ", _PUNCT.sub(" ", str(text).lower())).split()


def answer_score(answer: str, gold: str | Sequence[str], question: str = "", copy_weight: float = 0.5) -> float:
    """Normalised token F1 of ``answer`` against the best of ``gold``, not counting words restated from the question,
    times ``1 - copy_weight * (share of the answer restating the question)``.

    So "Paris." scores 1.0 for the capital of France, "The capital of France is Paris." 0.6, and an echo of the
    question plus junk 0: restating the question earns nothing, and only the gold's tokens count as right.
    """
    golds = [gold] if isinstance(gold, str) else [str(g) for g in gold]
    if not golds or not any(answer_tokens(g) for g in golds):
        raise ValueError(f"answer_score needs a non-empty reference answer, got {gold!r}")
    said = Counter(answer_tokens(answer))
    total = sum(said.values())
    if not total:
        return 0.0
    asked = set(answer_tokens(question))
    best = 0.0
    for g in golds:
        ref = Counter(answer_tokens(g))
        restated = sum(c for tok, c in said.items() if tok in asked and tok not in ref)
        counted = Counter({tok: c for tok, c in said.items() if not (tok in asked and tok not in ref)})
        common = sum((counted & ref).values())
        if not common:
            continue
        precision, recall = common / sum(counted.values()), common / sum(ref.values())
        f1 = 2 * precision * recall / (precision + recall)
        best = max(best, f1 * (1.0 - copy_weight * restated / total))
    return best


class AnswerJudge:
    """The trained agent's text scored against the episode's reference answer (``metadata['answer']``) by answer_score.

    Parroting the question and padding with junk both score low; an episode without a reference answer is an
    error (use an answer-free judge for such tasks), never a silent zero.
    """

    def __init__(self, author: str | None = None, copy_weight: float = 0.5) -> None:
        if not 0.0 <= copy_weight <= 1.0:
            raise ValueError(f"AnswerJudge copy_weight must be in [0, 1], got {copy_weight}")
        self.author, self.copy_weight = author, copy_weight

    def evaluate_trajectory(self, trajectory: EventLog) -> float:
        gold = trajectory.metadata.get("answer")
        if gold is None or (isinstance(gold, str) and not gold.strip()):
            raise ValueError(f"episode {trajectory.id} (task {episode_task(trajectory)[:80]!r}) has no reference answer "
                             "(metadata['answer']); AnswerJudge scores against one")
        return answer_score(agent_text(trajectory, self.author), gold, episode_task(trajectory), self.copy_weight)

    def __repr__(self) -> str:
        return f"AnswerJudge(copy_weight={self.copy_weight})"


class JudgeAdapter:
    """One judge node's scorer: ``score(trajectories) -> [float]`` over any supported judge object."""

    def __init__(self, name: str, judge: Any, mode: str = "absolute") -> None:
        if mode not in ("absolute", "relative"):
            raise ValueError(f"judge {name!r}: mode must be 'absolute' or 'relative', got {mode!r}")
        if not (hasattr(judge, "evaluate_trajectory") or _is_llm_judge(judge) or callable(judge)):
            raise TypeError(
                f"judge {name!r}: {type(judge).__name__} is not a judge; expected an LLMJudge, an object with "
                "evaluate_trajectory(trajectory), or a callable trajectory -> float"
            )
        if mode == "relative" and not callable(getattr(judge, "evaluate_batch", None)):
            raise ValueError(f"judge {name!r}: mode='relative' needs an LLMJudge (evaluate_batch), got {type(judge).__name__}")
        self.name, self.judge, self.mode = name, judge, mode

    def score(self, trajectories: Sequence[EventLog]) -> list[float]:
        """One finite score per trajectory; a failing judge raises naming itself."""
        logs = list(trajectories)
        try:
            if hasattr(self.judge, "evaluate_trajectory"):
                scores = [_evaluate_trajectory(self.judge.evaluate_trajectory, log) for log in logs]
            elif _is_llm_judge(self.judge):
                scores = self._llm_scores(logs)
            else:
                scores = [self.judge(log) for log in logs]
        except Exception as exc:
            raise JudgeNodeError(f"judge {self.name!r} failed: {type(exc).__name__}: {exc}") from exc
        out = []
        for i, s in enumerate(scores):
            try:
                value = float(s)
            except (TypeError, ValueError):
                raise JudgeNodeError(f"judge {self.name!r} returned a non-numeric score {s!r} for trajectory {i}") from None
            if not math.isfinite(value):
                raise JudgeNodeError(f"judge {self.name!r} returned a non-finite score {s!r} for trajectory {i}")
            out.append(value)
        return out

    def _llm_scores(self, logs: list[EventLog]) -> list[float]:
        if self.mode == "absolute":
            return [self.judge.evaluate(episode_task(log), log) for log in logs]
        groups: dict[str, list[int]] = {}
        for i, log in enumerate(logs):
            groups.setdefault(episode_task(log), []).append(i)
        out = [0.0] * len(logs)
        for task, idx in groups.items():
            for i, s in zip(idx, self.judge.evaluate_batch(task, [logs[i] for i in idx], mode="relative")):
                out[i] = s
        return out


_TASK_PARAMS = ("task", "prompt", "question")


def _evaluate_trajectory(method: Callable[..., Any], log: EventLog) -> Any:
    """``evaluate_trajectory(trajectory)``, or with the task too when the method names a task/prompt/question parameter."""
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return method(log)
    named = [p for p in params if p.name in _TASK_PARAMS and p.kind is not p.POSITIONAL_ONLY]
    if not named:
        return method(log)
    others = [p for p in params if p.name not in _TASK_PARAMS and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not others:
        return method(**{named[0].name: episode_task(log)})
    return method(**{named[0].name: episode_task(log), others[0].name: log}) if others[0].kind is not others[0].POSITIONAL_ONLY else method(log, **{named[0].name: episode_task(log)})


def _is_llm_judge(obj: Any) -> bool:
    """LLMJudge's protocol: ``evaluate(task, trajectory)`` (and ``evaluate_batch`` for relative mode)."""
    return callable(getattr(obj, "evaluate", None))


def aggregate_scores(scores: Mapping[str, Sequence[float]], how: str = "mean", weights: Mapping[str, float] | None = None) -> list[float]:
    """The panel's per-trajectory reward from each judge's scores: mean, median, or weighted (renormalized)."""
    if how not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, got {how!r}")
    names = list(scores)
    if not names:
        raise ValueError("aggregate_scores needs at least one judge's scores")
    n = len(scores[names[0]])
    for name in names:
        if len(scores[name]) != n:
            raise ValueError(f"judge {name!r} has {len(scores[name])} scores; expected {n}")
    if how == "median":
        return [float(statistics.median(scores[name][i] for name in names)) for i in range(n)]
    from agenttune_lib.rl.rewards import combine_rewards

    w = None
    if how == "weighted":
        weights = dict(weights or {})
        missing = [name for name in names if name not in weights]
        if missing:
            raise ValueError(f"weighted aggregate: no weight for judge(s) {missing}")
        w = [float(weights[name]) for name in names]
    combined = combine_rewards([_column(name, scores[name]) for name in names], w)
    return combined(completions=[None] * n)


def _column(name: str, values: Sequence[float]) -> Callable[..., list[float]]:
    """A judge's precomputed scores as a reward function, so combine_rewards weighs the panel."""

    def judge_column(completions: Sequence[Any], **_: Any) -> list[float]:
        return list(values)

    judge_column.__name__ = name
    return judge_column
