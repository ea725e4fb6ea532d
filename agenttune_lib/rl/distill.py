"""Agentic distillation: filter teacher trajectories, project them to SFT token rows, train a LoRA student.

The loss covers only the student's own reasoning, tool calls and answers: the token rows
come from ``EventLog.as_token_rows`` (completion-only mask), so retrieved text is context.
"""
from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.events import EventKind, EventLog

__all__ = ["FilterReport", "filter_teacher_trajectories", "distill", "token_rows_dataset", "as_full_tier"]

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
    logs: Sequence[EventLog], answer_check: Callable[[str, Any], bool] | None = None, require_answer: bool = False
) -> FilterReport:
    """Drop full-tier logs with a wrong final answer, a schema error, or a citation of nothing retrieved.

    The gold answer is read from ``metadata["answer"]`` (or ``gold_answer``); ``answer_check``
    overrides the default normalized-containment match.
    """
    kept: list[EventLog] = []
    dropped: dict[str, str] = {}
    for log in logs:
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
        for row in log.as_token_rows(tokenizer, max_length=max_length):
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
    **sft_kwargs: Any,
) -> Any:
    """Train ``student`` on the logs with TRL SFTTrainer, LoRA and completion-only loss; returns the trainer."""
    import dataclasses as dc

    import torch
    from trl import SFTConfig, SFTTrainer

    from agenttune_lib.rl.factory import lora_config

    dataset = token_rows_dataset(logs, tokenizer, max_length=max_length).remove_columns(["trajectory_id"])
    fields = {f.name for f in dc.fields(SFTConfig)}
    unknown = [k for k in sft_kwargs if k not in fields]
    if unknown:
        raise TypeError(f"distill: unknown keyword argument(s) {unknown}; not SFTConfig fields in the installed TRL")
    on_gpu = torch.cuda.is_available()
    config = {
        "output_dir": output_dir or tempfile.mkdtemp(prefix="agenttune-distill-"),
        "completion_only_loss": True,
        "use_cpu": not on_gpu,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "max_length": max_length,
    }
    config.update(sft_kwargs)
    return SFTTrainer(model=student, args=SFTConfig(**config), train_dataset=dataset, processing_class=tokenizer, peft_config=lora_config(lora))
