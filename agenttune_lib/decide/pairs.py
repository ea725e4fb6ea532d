"""Preference data from audit records: DPO pairs (chosen vs rejected) and BCO labels per model stage.

Pure functions over audit records, below both the audit reader and the collection bridge that call them.
"""
from __future__ import annotations

import collections
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["MODEL_STAGES", "extract_dpo_pairs", "extract_bco_labels", "run_is_good"]

MODEL_STAGES = ("llm_call", "llm_judge", "router")


def _prompt_key(template_id: Any, stage_id: Any, prompt: Any) -> str:
    return hashlib.sha256(f"{template_id}\x00{stage_id}\x00{prompt}".encode()).hexdigest()


def run_is_good(run: Mapping[str, Any] | None, stages: Sequence[Mapping[str, Any]]) -> bool:
    """A run counts as good when it completed, no stage failed, and every judge passed."""
    if not run or run.get("status") != "completed":
        return False
    for record in stages:
        if record.get("status") == "error":
            return False
        if record.get("stage_type") == "llm_judge" and record.get("passed") is False:
            return False
    return True


def _group(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for record in records:
        entry = runs.setdefault(record.get("run_id"), {"stages": [], "run": None})
        if record.get("record_type") == "run":
            entry["run"] = record
        elif record.get("record_type") == "stage":
            entry["stages"].append(record)
    return runs


def extract_dpo_pairs(records: Iterable[Mapping[str, Any]], max_pairs_per_prompt: int = 4) -> list[dict[str, Any]]:
    """Preference pairs ``{prompt, chosen, rejected, …}`` from audit records.

    Two sources: within a stage, a reply rejected by validation followed by an accepted
    reply to the same prompt (``source="retry"``); across runs, the same stage prompt
    answered in a good run (chosen) and in a failed one (rejected) (``source="cross_run"``).
    """
    runs = _group(records)
    pairs: list[dict[str, Any]] = []
    by_prompt: dict[str, dict[str, list[tuple[str, str, Mapping[str, Any]]]]] = collections.defaultdict(
        lambda: {"good": [], "bad": []}
    )
    for run_id, entry in runs.items():
        good = run_is_good(entry["run"], entry["stages"])
        for record in entry["stages"]:
            if record.get("stage_type") not in MODEL_STAGES:
                continue
            attempts = [a for a in record.get("attempts") or [] if isinstance(a, Mapping) and a.get("reply") is not None]
            accepted = [a for a in attempts if not a.get("error")]
            rejected = [a for a in attempts if a.get("error")]
            prompt = record.get("prompt") or (attempts[0].get("prompt") if attempts else None)
            if prompt is None:
                continue
            if accepted and rejected:
                for bad in rejected[:max_pairs_per_prompt]:
                    pairs.append({
                        "prompt": prompt, "chosen": accepted[-1]["reply"], "rejected": bad["reply"],
                        "template_id": record.get("template_id"), "stage_id": record.get("stage_id"),
                        "source": "retry", "chosen_run_id": run_id, "rejected_run_id": run_id,
                        "rejected_error": bad.get("error"),
                    })
            key = _prompt_key(record.get("template_id"), record.get("stage_id"), prompt)
            if good and accepted and record.get("status") == "ok":
                by_prompt[key]["good"].append((run_id, accepted[-1]["reply"], record))
            elif not good:
                final = (accepted or attempts or [None])[-1]
                if final is not None:
                    by_prompt[key]["bad"].append((run_id, final["reply"], record))
    for groups in by_prompt.values():
        made = 0
        for good_run, chosen, record in groups["good"]:
            for bad_run, rejected, _ in groups["bad"]:
                if made >= max_pairs_per_prompt or chosen == rejected:
                    continue
                pairs.append({
                    "prompt": record.get("prompt"), "chosen": chosen, "rejected": rejected,
                    "template_id": record.get("template_id"), "stage_id": record.get("stage_id"),
                    "source": "cross_run", "chosen_run_id": good_run, "rejected_run_id": bad_run,
                    "rejected_error": None,
                })
                made += 1
    return pairs


def extract_bco_labels(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Binary labels ``{prompt, completion, label, …}`` for every model reply in the audit log.

    ``label`` is True only for a reply that passed validation inside a good run (see
    ``run_is_good``); a rejected reply, or any reply of a failed run, is False.
    """
    out: list[dict[str, Any]] = []
    for run_id, entry in _group(records).items():
        good = run_is_good(entry["run"], entry["stages"])
        for record in entry["stages"]:
            if record.get("stage_type") not in MODEL_STAGES:
                continue
            for attempt in record.get("attempts") or []:
                if not isinstance(attempt, Mapping) or attempt.get("reply") is None:
                    continue
                valid = not attempt.get("error")
                out.append({
                    "prompt": attempt.get("prompt") or record.get("prompt"),
                    "completion": attempt["reply"],
                    "label": bool(valid and good and record.get("status") == "ok"),
                    "template_id": record.get("template_id"),
                    "stage_id": record.get("stage_id"),
                    "run_id": run_id,
                    "reason": attempt.get("error") if not valid else (None if good else f"run {entry['run'] and entry['run'].get('status')}"),
                })
    return out

