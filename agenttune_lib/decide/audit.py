"""The DECIDE audit trail: an append-only, hash-chained, redacted ``audit.jsonl``.

One JSON object per line, keys sorted. Two record types:

``record_type: "stage"`` — one per executed stage (parallel branches get their own line)::

    seq, run_id, template_id, stage_id, stage_type, visit (how many times this run has
    entered the stage, 1-based), step (the run's step number), output, status ("ok" |
    "error"), error (a message string, or for a tool failure the structured
    ``{"type", "message", "tool", …}`` dict), score (llm_judge score or null), passed
    (llm_judge verdict or null), tool, args, prompt, attempts ([{prompt, reply,
    error}] for model stages: every reply, rejected ones included), next_stage,
    duration_ms, timestamp (ISO-8601 UTC), prev_hash, hash

``record_type: "run"`` — one completion line per run::

    seq, run_id, template_id, status ("completed" | "error" | "step_limit"), verdict
    ({label, confidence, reason}), label, confidence, steps, visits ({stage_id: n}),
    max_steps, input_text, error, destinations ([{type, ok, error}]), timestamp,
    prev_hash, hash

``hash`` is SHA-256 over the canonical JSON of the record without ``hash``;
``prev_hash`` is the previous line's hash (64 zeros for the first). A sidecar
``audit.jsonl.head`` holds the last hash and the line count, so a deleted final line is
caught too. ``verify_audit(path)`` reports every broken link by line number.

Redaction: the writer applies a ``redact`` hook to each record before hashing and
writing; the runner passes one built from the template's ``redact.input_fields``, which
masks those input fields by key and every occurrence of their values anywhere in the
record (prompts, model replies, reasons).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agenttune_lib.decide.errors import AuditError

__all__ = [
    "AuditWriter",
    "AuditReader",
    "AuditVerification",
    "Redactor",
    "verify_audit",
    "record_hash",
    "GENESIS_HASH",
    "default_audit_path",
]

GENESIS_HASH = "0" * 64
#: Keys that identify and chain records; never redacted.
STRUCTURAL_KEYS = frozenset(
    {"record_type", "seq", "run_id", "template_id", "stage_id", "stage_type", "visit", "step", "status",
     "next_stage", "timestamp", "prev_hash", "hash", "review_id"}
)


def default_audit_path(artifacts_dir: str | Path | None = None) -> Path:
    """``<artifacts>/decide/audit.jsonl`` (artifacts from ``$AGENTTUNE_HOME`` unless given): where the platform's runs append."""
    if artifacts_dir is None:
        from agenttune_lib.config import PlatformPaths

        artifacts_dir = PlatformPaths.from_env().artifacts
    return Path(artifacts_dir) / "decide" / "audit.jsonl"


def _canonical(record: Mapping[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def record_hash(record: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``record`` without its ``hash`` key."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(_canonical(body).encode("utf-8")).hexdigest()


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class Redactor:
    """Masks personal-data input fields by key and by value, everywhere in a record."""

    def __init__(self, fields: Iterable[str], values: Mapping[str, Any] | None = None, mask: str = "[REDACTED:{field}]") -> None:
        self.fields = [str(f) for f in fields]
        self.mask = mask
        self._values: list[tuple[str, str]] = []
        for field, value in _field_values(values or {}, set(self.fields)):
            for text in _leaf_strings(value):
                if len(text) >= 4:
                    self._values.append((text, field))
        self._values.sort(key=lambda item: -len(item[0]))
        self._pattern = (
            re.compile("|".join(re.escape(v) for v, _ in self._values)) if self._values else None
        )
        self._by_value = dict(self._values)

    @classmethod
    def for_input(cls, fields: Iterable[str], input_fields: Mapping[str, Any]) -> "Redactor":
        return cls(fields, input_fields)

    def _mask_text(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self.mask.format(field=self._by_value[m.group(0)]), text)

    def __call__(self, value: Any) -> Any:
        if not self.fields:
            return value
        if isinstance(value, Mapping):
            return {
                k: (
                    v
                    if k in STRUCTURAL_KEYS
                    else self.mask.format(field=k)
                    if k in self.fields and not isinstance(v, (Mapping, list))
                    else self(v)
                )
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            return [self(v) for v in value]
        if isinstance(value, str):
            stripped = value.lstrip()
            if stripped[:1] in ("{", "["):
                # A JSON document (an input_text, say) is redacted as data, so it stays valid JSON.
                try:
                    parsed = json.loads(value)
                except ValueError:
                    parsed = None
                if isinstance(parsed, (dict, list)):
                    return json.dumps(self(parsed), ensure_ascii=False)
            return self._mask_text(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and self._values:
            masked = self._mask_text(str(value))
            return value if masked == str(value) else masked
        return value


def _field_values(data: Any, fields: set[str]) -> list[tuple[str, Any]]:
    """(field, value) for every key named in ``fields``, at any depth of the input."""
    out: list[tuple[str, Any]] = []
    if isinstance(data, Mapping):
        for key, value in data.items():
            if key in fields:
                out.append((key, value))
            else:
                out.extend(_field_values(value, fields))
    elif isinstance(data, (list, tuple)):
        for item in data:
            out.extend(_field_values(item, fields))
    return out


def _leaf_strings(value: Any) -> list[str]:
    if value is None or isinstance(value, bool):
        return []
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _leaf_strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _leaf_strings(v)]
    text = str(value).strip()
    out = [text] if text else []
    if isinstance(value, str):
        out += [json.dumps(value)[1:-1]] if json.dumps(value)[1:-1] != text else []
    return out


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _head_path(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def _read_last(path: Path) -> tuple[int, str]:
    """(line count, last hash) by scanning the file: the fallback when the head file is absent."""
    count, last = 0, GENESIS_HASH
    if not path.exists():
        return count, last
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            count += 1
            try:
                last = json.loads(line).get("hash", last)
            except ValueError:
                pass
    return count, last


class AuditWriter:
    """Appends records to the chain under a file lock; ``redact`` masks each record before it is hashed."""

    def __init__(self, path: str | Path, redact: Callable[[Any], Any] | None = None) -> None:
        self.path = Path(path)
        self.redact = redact

    def _state(self) -> tuple[int, str]:
        head = _head_path(self.path)
        if head.exists() and self.path.exists():
            try:
                data = json.loads(head.read_text(encoding="utf-8"))
                return int(data["count"]), str(data["hash"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return _read_last(self.path)

    def append(self, record: Mapping[str, Any], redact: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        """Redact, chain, hash and append one record; returns what was written."""
        hook = redact or self.redact
        body = dict(hook(dict(record)) if hook else record)
        body.setdefault("timestamp", utc_now())
        body = json.loads(_canonical(body))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self.path):
            count, prev = self._state()
            body["seq"] = count
            body["prev_hash"] = prev
            body.pop("hash", None)
            body["hash"] = record_hash(body)
            line = _canonical(body)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            head = _head_path(self.path)
            tmp = head.with_name(head.name + ".tmp")
            tmp.write_text(json.dumps({"count": count + 1, "hash": body["hash"]}), encoding="utf-8")
            os.replace(tmp, head)
        return body


@dataclasses.dataclass
class AuditVerification:
    """Result of checking a chain: ``ok``, the number of lines, and each problem with its line number."""

    path: str
    ok: bool
    count: int
    problems: list[str]
    warnings: list[str]

    def __bool__(self) -> bool:
        return self.ok


def verify_audit(path: str | Path) -> AuditVerification:
    """Recompute every hash and link; an edited, inserted, reordered or deleted line is reported."""
    path = Path(path)
    if not path.exists():
        raise AuditError(f"audit log {str(path)!r} does not exist")
    problems: list[str] = []
    warnings: list[str] = []
    prev = GENESIS_HASH
    count = 0
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                problems.append(f"line {lineno}: blank line")
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                problems.append(f"line {lineno}: not JSON ({exc})")
                prev = "<unknown>"
                count += 1
                continue
            if not isinstance(record, dict):
                problems.append(f"line {lineno}: not a JSON object")
                count += 1
                continue
            if record.get("seq") != count:
                problems.append(f"line {lineno}: seq is {record.get('seq')!r}, expected {count} (a line was deleted or inserted)")
            if record.get("prev_hash") != prev and prev != "<unknown>":
                problems.append(f"line {lineno}: prev_hash does not match the previous line's hash (chain broken)")
            if record_hash(record) != record.get("hash"):
                problems.append(f"line {lineno}: hash mismatch (the line was edited)")
            prev = record.get("hash", "<unknown>")
            count += 1
    head = _head_path(path)
    if head.exists():
        try:
            data = json.loads(head.read_text(encoding="utf-8"))
            if int(data.get("count", -1)) != count:
                problems.append(f"head file records {data.get('count')} lines, the log has {count} (lines were removed or added at the end)")
            elif data.get("hash") != prev:
                problems.append("head file's last hash does not match the log's last line")
        except (OSError, ValueError, TypeError) as exc:
            problems.append(f"head file unreadable: {exc}")
    elif count:
        warnings.append(f"no head file {head.name}: deletion of final lines cannot be ruled out")
    return AuditVerification(str(path), not problems, count, problems, warnings)


class AuditReader:
    """Reads an audit log: records, per-run grouping, chain verification, and training-data extraction."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            raise AuditError(f"audit log {str(self.path)!r} does not exist")
        out = []
        with open(self.path, encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError as exc:
                    raise AuditError(f"audit log {str(self.path)!r} line {lineno} is not JSON: {exc}") from None
        return out

    def runs(self) -> dict[str, dict[str, Any]]:
        """run_id → ``{"stages": [stage records in order], "run": completion record or None}``."""
        runs: dict[str, dict[str, Any]] = {}
        for record in self.records():
            entry = runs.setdefault(record.get("run_id"), {"stages": [], "run": None})
            if record.get("record_type") == "run":
                entry["run"] = record
            else:
                entry["stages"].append(record)
        return runs

    def verify(self) -> AuditVerification:
        return verify_audit(self.path)

    def extract_dpo_pairs(self, **kwargs: Any) -> list[dict[str, Any]]:
        from agenttune_lib.decide.collect import extract_dpo_pairs

        return extract_dpo_pairs(self.records(), **kwargs)

    def extract_bco_labels(self, **kwargs: Any) -> list[dict[str, Any]]:
        from agenttune_lib.decide.collect import extract_bco_labels

        return extract_bco_labels(self.records(), **kwargs)
