"""Agentic distillation: filter teacher trajectories, project them to SFT token rows, train a LoRA student.

Only successful episodes are learned from: a log whose episode reward is below the success
threshold, an evaluation log, or a non-demonstration is dropped, and training refuses when
fewer than ``min_episodes`` remain. The loss covers only the student's own reasoning, tool
calls and answers, weighted per paper Table 3 (``WeightedSFTTrainer``); ``loss`` selects the
Table 11 ablations (answer-only, unmasked trajectory, masked, masked + weights).
"""
from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.events import EventKind, EventLog
from agenttune_lib.models.chat_tokens import token_rows, tokenize_messages

__all__ = [
    "FilterReport",
    "filter_teacher_trajectories",
    "require_min_episodes",
    "distill",
    "token_rows_dataset",
    "weighted_token_rows",
    "as_full_tier",
    "clip_tool_results",
    "turn_rows",
    "ROW_MODES",
    "TrainingWallClockExceeded",
    "wall_clock_guard",
    "LOSS_MODES",
    "NotEnoughEpisodes",
]

#: Table 11's ablations: answer-only SFT, trajectory SFT without mask, masked, masked with Table 3 weights.
LOSS_MODES = ("answer_only", "unmasked", "masked", "weighted")

#: Lifecycle stages whose logs are held-out measurements, never training data unless named.
EVAL_STAGES = frozenset({"evaluate", "evaluation"})


class NotEnoughEpisodes(ValueError):
    """Fewer successful teacher episodes survived filtering than the configured minimum."""

_CITE = re.compile(r"\[(?:doc|chunk|source)[:_ #-]*([A-Za-z0-9_.:-]+)\]", re.I)
_SCHEMA_ERRORS = {"invalid_arguments", "parse_error", "unknown_tool", "schema_error"}


@dataclasses.dataclass
class FilterReport:
    """Which teacher trajectories survived and why the rest were dropped."""

    kept: list[EventLog]
    dropped: dict[str, str]

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {"kept": len(self.kept)}
        for reason in self.dropped.values():
            out[reason] = out.get(reason, 0) + 1
        return out


def _final_text(log: EventLog) -> str:
    texts = [e for e in log.events if e.kind is EventKind.TEXT]
    if not texts:
        return ""
    p = texts[-1].payload
    value = p.get("content", p.get("text", ""))
    return value if isinstance(value, str) else str(value)


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^a-z0-9 .%-]", " ", str(text).lower())).strip()


def _answer_ok(log: EventLog, answer_check: Callable[[str, Any], bool] | None) -> bool | None:
    gold = log.metadata.get("answer", log.metadata.get("gold_answer"))
    if gold is None:
        return None
    final = _final_text(log)
    if answer_check is not None:
        return bool(answer_check(final, gold))
    return _normalize(str(gold)) in _normalize(final) if str(gold).strip() else True


def filter_teacher_trajectories(
    logs: Sequence[EventLog],
    answer_check: Callable[[str, Any], bool] | None = None,
    require_answer: bool = False,
    success_threshold: float | None = 1.0,
    include_stages: Sequence[str] = (),
) -> FilterReport:
    """Drop logs that failed (episode reward below ``success_threshold``), evaluation logs, non-demonstrations,
    and full-tier logs with a wrong final answer, a schema error, or a citation of nothing retrieved.

    A log with no episode reward is judged by the remaining checks alone. Evaluation logs
    (``metadata["lifecycle_stage"]`` in evaluate/evaluation) are kept only when their stage
    is named in ``include_stages``. The gold answer is read from ``metadata["answer"]`` (or
    ``gold_answer``); ``answer_check`` overrides the default normalized-containment match.
    """
    kept: list[EventLog] = []
    dropped: dict[str, str] = {}
    for log in logs:
        stage = str(log.metadata.get("lifecycle_stage") or "")
        if stage in EVAL_STAGES and stage not in include_stages:
            dropped[log.id] = "evaluation_log"
            continue
        rewards = log.rewards("episode")
        if success_threshold is not None and rewards and rewards[-1] < success_threshold:
            dropped[log.id] = "below_success_threshold"
            continue
        if log.metadata.get("non_demonstration"):
            dropped[log.id] = "non_demonstration"
            continue
        if log.tier != "full":
            dropped[log.id] = "not_full_tier"
            continue
        if any(e.is_error and (e.payload.get("error") or {}).get("type") in _SCHEMA_ERRORS for e in log.events if isinstance(e.payload.get("error"), dict)):
            dropped[log.id] = "schema_error"
            continue
        ok = _answer_ok(log, answer_check)
        if ok is False or (ok is None and require_answer):
            dropped[log.id] = "wrong_final_answer"
            continue
        final = _final_text(log)
        cited = _CITE.findall(final)
        if cited:
            retrieved = " ".join(str(e.payload.get("content", "")) + " " + str(e.payload.get("metadata", "")) for e in log.events if e.kind is EventKind.TOOL_RESULT)
            if any(c not in retrieved for c in cited):
                dropped[log.id] = "ungrounded_citation"
                continue
        kept.append(log)
    return FilterReport(kept, dropped)


def require_min_episodes(report: FilterReport, min_episodes: int) -> list[EventLog]:
    """The kept logs, or ``NotEnoughEpisodes`` naming the counts when fewer than ``min_episodes`` survived."""
    if len(report.kept) < max(int(min_episodes), 1):
        raise NotEnoughEpisodes(
            f"distillation needs at least {max(int(min_episodes), 1)} successful teacher episodes, "
            f"{len(report.kept)} survived filtering ({report.counts}); collect with a teacher that succeeds "
            "(e.g. the expert teacher) or lower min_episodes / success_threshold explicitly"
        )
    return list(report.kept)


def clip_tool_results(log: EventLog, max_chars: int | None) -> EventLog:
    """The log with tool results clipped as the spine clips them in the student's prompt (``max_tool_chars``)."""
    if not max_chars:
        return log
    from agenttune_lib.events import Event

    events = []
    for e in log.events:
        content = e.payload.get("content")
        if e.kind is EventKind.TOOL_RESULT and isinstance(content, str) and len(content) > max_chars and not e.payload.get("error"):
            payload = {**e.payload, "content": content[:max_chars] + f"… [{len(content) - max_chars} more characters]"}
            e = Event(e.kind, payload, author=e.author, scope=e.scope)
        events.append(e)
    return EventLog(events, tier=log.tier, id=log.id, metadata=log.metadata, token_ids=log.token_ids)


def _answer_only_row(log: EventLog, tokenizer: Any) -> dict[str, Any] | None:

    task = log.metadata.get("task")
    first = log.events[0] if len(log) else None
    if first is not None and first.kind is EventKind.OBSERVATION:
        task = first.payload.get("content", task)
    answer = _final_text(log)
    if not isinstance(task, str) or not task or not answer:
        return None
    messages = ([{"role": "system", "content": log.metadata["system_prompt"]}] if log.metadata.get("system_prompt") else [])
    messages += [{"role": "user", "content": task}, {"role": "assistant", "content": answer}]
    weights = [0.0] * (len(messages) - 1) + [1.0]
    ids, w = tokenize_messages(tokenizer, messages, weights)
    return {"id": log.id, "input_ids": ids, "token_weights": w}


#: How training rows are cut from an episode: ``turns`` (default) puts every assistant turn, the final answer
#: included, in a loss-bearing position (one row per episode when it fits ``max_length``, else one row per turn with
#: tool results compacted, older ones first, then the newest to the passage the turn uses); ``truncate`` keeps one
#: row per episode cut from the right (answers may fall off).
ROW_MODES = ("turns", "truncate")

#: What an older tool result is cut to when a per-turn row must shrink to fit (the newest one: ``FOCUS_WINDOWS``).
COMPACT_TOOL_CHARS = 160


def _mode_weights(weights: Sequence[float], loss: str) -> list[float]:
    w = [float(x) for x in weights]
    if loss == "masked":
        return [1.0 if x > 0 else 0.0 for x in w]
    if loss == "unmasked":
        return [1.0] * len(w)
    return w


_COMPACTED = "older result compacted:"

#: Windows (characters) the newest tool result is cut to, largest first, when compacting older results is not enough:
#: the window sharing the most words with the turn being learned (the passage an answer or next query comes from).
FOCUS_WINDOWS = (1600, 1200, 800, 480, 240)
_FOCUS_STEP = 40
_WORD = re.compile(r"[a-z0-9]{3,}")
_STOP_WORDS = frozenset({"the", "and", "for", "with", "that", "this", "are", "was", "from", "not", "any", "all"})
_ESCAPE = re.compile(r"\\u[0-9a-f]{4}|\\[nrt\"\\]")
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def _turn_words(turn: str) -> frozenset[str]:
    """The words a turn takes from its context: a call's argument values (not its wrapper), else the reply's words."""
    call = _CALL.search(turn)
    if call:
        try:
            args = json.loads(call.group(1)).get("arguments")
            turn = " ".join(str(v) for v in args.values()) if isinstance(args, dict) else str(args)
        except (ValueError, AttributeError):
            pass
    return frozenset(_WORD.findall(turn.lower())) - _STOP_WORDS


def _compacted(messages: list[dict[str, Any]], keep_last: int, wanted: frozenset[str] = frozenset()) -> list[dict[str, Any]] | None:
    """``messages`` with the oldest un-compacted tool result before index ``keep_last`` cut to ``COMPACT_TOOL_CHARS``:
    the window sharing the most of the turn's ``wanted`` words (its head when none does); None when none is left."""
    for i, m in enumerate(messages[:keep_last]):
        content = m.get("content")
        if (m.get("role") == "tool" and isinstance(content, str) and len(content) > COMPACT_TOOL_CHARS + 40
                and _COMPACTED not in content):
            start = _best_window(content, wanted, COMPACT_TOOL_CHARS)
            kept = content[start:start + COMPACT_TOOL_CHARS]
            out = list(messages)
            out[i] = {**m, "content": ("… " if start else "") + kept + f"… [{_COMPACTED} {len(content) - len(kept)} characters]"}
            return out
    return None


def _best_window(text: str, wanted: frozenset[str], window: int) -> int:
    """Start of the ``window`` characters of ``text`` holding the most ``wanted`` words; the earliest on ties, so 0
    (the head) when none holds one."""
    if not wanted:
        return 0
    plain = _ESCAPE.sub(lambda m: " " * len(m.group(0)), text.lower())  # JSON's \u201c must not join a quoted word
    starts = range(0, max(len(text) - window, 0) + _FOCUS_STEP, _FOCUS_STEP)
    return max(starts, key=lambda i: (len(wanted & set(_WORD.findall(plain[i:i + window]))), -i))


def _focus_window(result: str, wanted: frozenset[str], window: int) -> str | None:
    """``result`` cut to its ``window`` characters holding the most ``wanted`` words, the cut marked; None when it is
    already that short."""
    if len(result) <= window + 40:
        return None
    start = _best_window(result, wanted, window)
    end = min(start + window, len(result))
    head = f"[… {start} characters] " if start else ""
    tail = f" [… {len(result) - end} characters]" if end < len(result) else ""
    return f"{head}{result[start:end]}{tail}"


def _focused(messages: list[dict[str, Any]], result: Any, k: int, window: int, wanted: frozenset[str]) -> list[dict[str, Any]] | None:
    """``messages`` with the tool result just before turn ``k`` (whole: ``result``) cut to its ``window`` around the
    turn's ``wanted`` words; None when there is no such result or it is already that short."""
    prev = messages[k - 1] if k >= 1 else None
    if prev is None or prev.get("role") != "tool" or not isinstance(result, str):
        return None
    cut = _focus_window(result, wanted, window)
    if cut is None:
        return None
    out = list(messages)
    out[k - 1] = {**prev, "content": cut}
    return out


def _unmask(weights: list[float], loss: str) -> list[float]:
    """``unmasked`` puts loss on every token, role headers included (as the truncate rows do)."""
    return [1.0] * len(weights) if loss == "unmasked" else weights


def turn_rows(log: EventLog, tokenizer: Any, loss: str = "weighted", max_length: int | None = None,
              answer_weight: float = 1.0) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Token rows in which every weighted assistant turn of ``log`` carries loss, and what it took.

    One row for the whole episode when it fits ``max_length``; otherwise one row per turn, the context of each
    shrunk until it fits: older tool results compacted (oldest first), then the newest result, the one the turn
    answers from, cut to the window of ``FOCUS_WINDOWS`` that shares the most words with the turn. A turn that
    cannot fit even then is counted in ``turns_dropped``, never silently cut. ``answer_weight`` multiplies the
    weight of each answer written after a tool result (not a decline, which follows none).
    """

    sft = log.as_dataset_rows("sft")[0]
    messages, weights = list(sft["messages"]), _mode_weights(sft["segment_weights"], loss)
    turns = [i for i, (m, w) in enumerate(zip(messages, weights)) if m["role"] == "assistant" and w > 0]
    answers = {i for i in turns if "<tool_call>" not in str(messages[i].get("content"))}  # a reply, not a call
    first_tool = next((i for i, m in enumerate(messages) if m["role"] == "tool"), len(messages))
    evidence_answers = sorted(i for i in answers if i > first_tool)
    if loss != "unmasked":
        for i in evidence_answers:
            weights[i] *= answer_weight
    stats = {"rows": 0, "turns": len(turns), "turns_dropped": 0, "per_turn_rows": 0, "compactions": 0, "focused": 0,
             "answer_turns": len(answers), "answer_turns_dropped": 0, "evidence_answer_turns": len(evidence_answers)}
    if not turns:
        return [], stats
    end = turns[-1] + 1
    ids, w = tokenize_messages(tokenizer, messages[:end], weights[:end])
    if max_length is None or len(ids) <= max_length:
        stats["rows"] = 1
        return [{"id": log.id, "input_ids": ids, "token_weights": _unmask(w, loss)}], stats
    rows = []
    for k in turns:
        msgs = messages[: k + 1]
        tw = [0.0] * k + [weights[k]] if loss != "unmasked" else [1.0] * (k + 1)
        ids, w = tokenize_messages(tokenizer, msgs, tw)
        wanted = _turn_words(str(messages[k].get("content", ""))) if len(ids) > max_length else frozenset()
        while len(ids) > max_length:
            smaller = _compacted(msgs, keep_last=max(k - 1, 0), wanted=wanted)
            if smaller is None:
                break
            msgs, stats["compactions"] = smaller, stats["compactions"] + 1
            ids, w = tokenize_messages(tokenizer, msgs, tw)
        for window in FOCUS_WINDOWS if len(ids) > max_length else ():
            smaller = _focused(msgs, messages[k - 1].get("content"), k, window, wanted)
            if smaller is not None:
                msgs = smaller
                ids, w = tokenize_messages(tokenizer, msgs, tw)
            if len(ids) <= max_length:
                stats["focused"] += smaller is not None
                break
        if len(ids) > max_length:
            stats["turns_dropped"] += 1
            stats["answer_turns_dropped"] += k in answers
            continue
        rows.append({"id": f"{log.id}#turn{k}", "input_ids": ids, "token_weights": _unmask(w, loss)})
    stats["rows"] = stats["per_turn_rows"] = len(rows)
    return rows, stats


def weighted_token_rows(
    logs: Sequence[EventLog], tokenizer: Any, loss: str = "weighted", max_length: int | None = None, max_tool_chars: int | None = None,
    rows_mode: str = "turns", stats: dict[str, int] | None = None, answer_weight: float = 1.0,
) -> list[dict[str, Any]]:
    """Trainer rows (input_ids, labels, token_weights, trajectory_id) for one of ``LOSS_MODES``.

    weighted: Table 3 weights; masked: 1 on every agent token; unmasked: 1 on every token
    (prompt and tool results too); answer_only: the question and the final answer alone.
    ``rows_mode`` is one of ``ROW_MODES``; ``stats`` (a dict) receives the row, turn and compaction counts.
    ``answer_weight`` (rows_mode "turns") multiplies the weight of answers written after a tool result.
    """
    from agenttune_lib.rl.weighted_sft import weighted_rows

    if loss not in LOSS_MODES:
        raise ValueError(f"unknown distillation loss {loss!r}; expected one of {LOSS_MODES}")
    if rows_mode not in ROW_MODES:
        raise ValueError(f"unknown rows_mode {rows_mode!r}; expected one of {ROW_MODES}")
    totals: dict[str, int] = {}
    out = []
    for log in logs:
        if loss == "answer_only":
            row = _answer_only_row(log, tokenizer)
            rows = [row] if row else []
        elif rows_mode == "turns":
            rows, st = turn_rows(clip_tool_results(log, max_tool_chars), tokenizer, loss, max_length, answer_weight)
            for key, v in st.items():
                totals[key] = totals.get(key, 0) + v
        else:
            rows = [{**r, "token_weights": _mode_weights(r["token_weights"], loss)} for r in token_rows(clip_tool_results(log, max_tool_chars), tokenizer)]
        for row in rows:
            for r in weighted_rows([{"id": row["id"], "input_ids": row["input_ids"], "token_weights": row["token_weights"]}], max_length):
                r["trajectory_id"] = log.id
                out.append(r)
    if stats is not None:
        stats.update(totals)
        stats["training_rows"] = len(out)
        stats["training_tokens"] = sum(len(r["input_ids"]) for r in out)
    if not out:
        raise ValueError(f"no trainable rows for loss {loss!r}: every trajectory's projection carries no weighted token")
    return out


_SEGMENT_KINDS = {EventKind.TEXT, EventKind.REASONING, EventKind.TOOL_CALL, EventKind.TOOL_RESULT, EventKind.OBSERVATION, EventKind.MEMORY_OP}


def as_full_tier(log: EventLog, tokenizer: Any) -> EventLog:
    """A light-tier log re-projected to full tier under ``tokenizer`` (same id, events, metadata and rewards)."""
    from agenttune_lib.rl.rollout import episode_to_eventlog

    if log.tier == "full":
        return log
    events = list(log.events)
    task = log.metadata.get("task")
    if events and events[0].kind is EventKind.OBSERVATION:
        first = events.pop(0).payload
        task = task if isinstance(task, str) and task else first.get("content", first.get("text", ""))
    if not isinstance(task, str) or not task:
        raise ValueError(f"log {log.id!r} has no task (metadata['task'] or a leading OBSERVATION) to re-project")
    segments = [{"kind": e.kind.value, "payload": dict(e.payload), "author": e.author} for e in events if e.kind in _SEGMENT_KINDS]
    full, _ = episode_to_eventlog(tokenizer, log.metadata.get("system_prompt"), task, segments, metadata=log.metadata, id=log.id)
    rewards = [e for e in events if e.kind is EventKind.REWARD]
    if rewards:
        full = EventLog(list(full.events) + rewards, tier="full", id=full.id, metadata=full.metadata, token_ids=full.token_ids)
    return full


def token_rows_dataset(logs: Sequence[EventLog], tokenizer: Any, max_length: int | None = None) -> Any:
    """A datasets.Dataset of input_ids/completion_mask rows from the logs' SFT projection."""
    from datasets import Dataset

    rows = []
    for log in logs:
        for row in token_rows(log, tokenizer, max_length=max_length):
            if any(row["completion_mask"]):
                rows.append({"input_ids": row["input_ids"], "completion_mask": row["completion_mask"], "trajectory_id": log.id})
    if not rows:
        raise ValueError("no trainable rows: every trajectory's SFT projection has an empty completion mask")
    return Dataset.from_list(rows)


def distill(
    student: Any,
    tokenizer: Any,
    logs: Sequence[EventLog],
    lora: Any = True,
    max_length: int | None = 512,
    output_dir: str | None = None,
    loss: str = "weighted",
    success_threshold: float | None = 1.0,
    min_episodes: int = 1,
    max_tool_chars: int | None = None,
    include_stages: Sequence[str] = (),
    max_wall_s: float | None = None,
    rows_mode: str = "turns",
    extra_logs: Sequence[EventLog] = (),
    answer_weight: float = 1.0,
    **sft_kwargs: Any,
) -> Any:
    """Train ``student`` on the successful logs with LoRA and the token-weighted loss; returns the (untrained) trainer.

    The logs are filtered here too (``filter_teacher_trajectories`` with ``success_threshold``
    and ``include_stages``), so no caller can hand a failed episode to the loss by default;
    fewer than ``min_episodes`` survivors raise ``NotEnoughEpisodes``. ``loss`` is one of
    ``LOSS_MODES``; ``max_tool_chars`` clips tool results as the student's prompt does.
    Training is bounded by optimizer steps (``max_steps`` / ``num_train_epochs``), never by the clock, so the same
    seed, config and data give the same adapter on any load. ``max_wall_s`` is only a safety stop: crossing it
    raises ``TrainingWallClockExceeded`` naming the setting. ``extra_logs`` (e.g. no-tool demonstrations) join the
    filtered episodes as they are. ``answer_weight`` multiplies the weight of answers written after a tool result.
    ``trainer.agenttune_row_stats`` says how many rows, turns and tokens it built.
    """
    import dataclasses as dc

    import torch
    from datasets import Dataset
    from trl import SFTConfig

    from agenttune_lib.rl.lora import lora_config
    from agenttune_lib.rl.weighted_sft import WeightedSFTTrainer

    report = filter_teacher_trajectories(logs, success_threshold=success_threshold, include_stages=include_stages)
    kept = require_min_episodes(report, min_episodes)
    row_stats: dict[str, int] = {}
    rows = weighted_token_rows(list(kept) + list(extra_logs), tokenizer, loss=loss, max_length=max_length, max_tool_chars=max_tool_chars,
                               rows_mode=rows_mode, stats=row_stats, answer_weight=answer_weight)
    dataset = Dataset.from_list([{k: r[k] for k in ("input_ids", "labels", "token_weights")} for r in rows])
    fields = {f.name for f in dc.fields(SFTConfig)}
    unknown = [k for k in sft_kwargs if k not in fields]
    if unknown:
        raise TypeError(f"distill: unknown keyword argument(s) {unknown}; not SFTConfig fields in the installed TRL")
    on_gpu = torch.cuda.is_available()
    config = {
        "output_dir": output_dir or tempfile.mkdtemp(prefix="agenttune-distill-"),
        "use_cpu": not on_gpu,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "max_length": max_length,
        "dataset_kwargs": {"skip_prepare_dataset": True},
        "remove_unused_columns": False,
        # On a CPU, checkpointing re-runs each forward in the backward pass for no memory need at this size.
        "gradient_checkpointing": False,
        "include_num_input_tokens_seen": "non_padding",
    }
    config.update(sft_kwargs)
    callbacks = [wall_clock_guard(max_wall_s)] if max_wall_s else None
    trainer = WeightedSFTTrainer(
        model=student, args=SFTConfig(**config), train_dataset=dataset, processing_class=tokenizer, peft_config=lora_config(lora), callbacks=callbacks
    )
    trainer.agenttune_filter_counts = report.counts
    trainer.agenttune_trajectory_ids = [log.id for log in kept] + [log.id for log in extra_logs]
    trainer.agenttune_row_stats = row_stats
    return trainer



class TrainingWallClockExceeded(RuntimeError):
    """Training ran past its safety wall-clock limit (``max_wall_s``); the run fails instead of saving a shorter adapter."""


def wall_clock_guard(seconds: float) -> Any:
    """A TrainerCallback that fails training once it has run ``seconds`` (a safety stop, never a step budget)."""
    import time

    from transformers import TrainerCallback

    class WallClockGuard(TrainerCallback):
        def __init__(self) -> None:
            self.seconds, self.start = float(seconds), None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self.start = time.perf_counter()
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            elapsed = time.perf_counter() - (self.start or time.perf_counter())
            if elapsed > self.seconds and state.global_step < state.max_steps:
                raise TrainingWallClockExceeded(
                    f"training passed its safety limit max_wall_s={self.seconds:g} s after {state.global_step} of {state.max_steps} steps "
                    f"({elapsed:.0f} s); raise max_wall_s (or 0 for none) or lower the step count: the adapter is bounded by steps, "
                    "never cut short by the clock"
                )
            return control

    return WallClockGuard()
