"""The DECIDE audit trail: an append-only, HMAC-chained, redacted ``audit.jsonl`` with its head kept outside it.

One JSON object per line, keys sorted. Two record types:

``record_type: "stage"`` — one per executed stage (parallel branches get their own line)::

    seq, run_id, template_id, stage_id, stage_type, visit (how many times this run has
    entered the stage, 1-based), step (the run's step number), output, status ("ok" |
    "error"), error (a message string, or for a tool failure the structured
    ``{"type", "message", "tool", …}`` dict), score (llm_judge score or null), passed
    (llm_judge verdict or null), tool, args, prompt, attempts ([{prompt, reply,
    error}] for model stages: every reply, rejected ones included), next_stage,
    duration_ms, timestamp (ISO-8601 UTC), key_id, prev_hash, hash

``record_type: "run"`` — one completion line per run::

    seq, run_id, template_id, status ("completed" | "error" | "step_limit"), verdict
    ({label, confidence, reason}), label, confidence, steps, visits ({stage_id: n}),
    max_steps, input_text, error, destinations ([{type, ok, error}]), timestamp,
    prev_hash, hash

``hash`` is HMAC-SHA256, keyed, over the canonical JSON of the record without ``hash``; ``prev_hash`` is
the previous line's hash (64 zeros for the first); ``key_id`` fingerprints the key. The key comes from
``$AGENTTUNE_AUDIT_KEY``, ``$AGENTTUNE_AUDIT_KEY_FILE`` or ``$AGENTTUNE_HOME/secrets/audit.key`` — never from
the log's folder — so whoever can rewrite the log cannot re-sign it. The head (line count, last hash, byte
size) is checkpointed outside the log: in the warehouse table ``decide_audit_heads`` when a warehouse is
given, else in ``$AGENTTUNE_HOME/audit_heads/``. ``verify_audit(path, warehouse=...)`` reports every broken
link by line number, a missing head, truncation, an emptied log and a chain recomputed without the key; the
writer reconciles head and file under its lock after a crash.

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
import hmac
import json
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agenttune_lib.decide.errors import AuditError
from agenttune_lib.decide.pairs import extract_bco_labels, extract_dpo_pairs

__all__ = [
    "AuditWriter",
    "AuditReader",
    "AuditVerification",
    "AuditHead",
    "FileHeadStore",
    "WarehouseHeadStore",
    "Redactor",
    "verify_audit",
    "rotate_audit",
    "require_verified",
    "load_audit_key",
    "record_mac",
    "record_hash",
    "GENESIS_HASH",
    "default_audit_path",
]

GENESIS_HASH = "0" * 64
#: The HMAC key itself (any string of 16+ bytes), or a file holding it.
AUDIT_KEY_ENV = "AGENTTUNE_AUDIT_KEY"
AUDIT_KEY_FILE_ENV = "AGENTTUNE_AUDIT_KEY_FILE"
#: Keys that identify and chain records; never redacted.
STRUCTURAL_KEYS = frozenset(
    {"record_type", "seq", "run_id", "template_id", "stage_id", "stage_type", "visit", "step", "status",
     "next_stage", "timestamp", "prev_hash", "hash", "review_id", "key_id", "label", "confidence", "score",
     "passed", "route", "decision", "reviewer", "tool", "steps", "max_steps", "duration_ms", "parent",
     "served_adapter_id", "created_at", "opened_at", "deadline", "timeout_seconds", "decided_at", "expected_label"}
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
    """Masks personal data everywhere in a record before it leaves a run.

    Listed input fields are masked by key, and their values wherever they reappear — case-, accent-, spacing- and
    format-insensitively (``privacy.values``: a date of birth rewritten as "12 April 1988", a name as "LOPEZ,
    Maria"). Then Presidio's detectors (``privacy.pii``: e-mail, phone, IBAN, card, dates, national ids, names and
    places by NER) mask unlisted PII in every free-text string. ``detector=None`` turns the detectors off.
    """

    def __init__(
        self, fields: Iterable[str], values: Mapping[str, Any] | None = None, mask: str = "[REDACTED:{field}]",
        detector: Any = "default",
    ) -> None:
        from agenttune_lib.privacy.values import value_patterns

        self.fields = [str(f) for f in fields]
        self.mask = mask
        self._detector = detector
        self._values: list[tuple[str, str]] = []
        self._patterns: list[tuple[re.Pattern[str], str]] = []
        for field, value in _field_values(values or {}, set(self.fields)):
            for text in _leaf_strings(value):
                if len(text) >= 4:
                    self._values.append((text, field))
            for leaf in _leaf_values(value):
                self._patterns += [(p, field) for p in value_patterns(leaf, field)]
        self._values.sort(key=lambda item: -len(item[0]))
        # Longest first, across fields: an e-mail is masked whole before the name inside it.
        self._patterns.sort(key=lambda item: -len(item[0].pattern))
        self._pattern = (
            re.compile("|".join(re.escape(v) for v, _ in self._values)) if self._values else None
        )
        self._by_value = dict(self._values)

    @classmethod
    def for_input(cls, fields: Iterable[str], input_fields: Mapping[str, Any], detector: Any = "default") -> "Redactor":
        return cls(fields, input_fields, detector=detector)

    @property
    def detector(self) -> Any:
        if self._detector == "default":
            from agenttune_lib.privacy import default_detector

            self._detector = default_detector()
        return self._detector

    def _mask_text(self, text: str, detect: bool = True) -> str:
        """Mask the union of what the detectors and the listed values find in the original text (one pass, so
        neither hides a match from the other: NER sees "Eleanor Whitfield" whole, the address pattern its city)."""
        from agenttune_lib.privacy.pii import apply_spans

        spans: list[tuple[int, int, str]] = list(self.detector.spans(text)) if detect and self._detector is not None else []
        if self._pattern is not None:
            spans += [(m.start(), m.end(), self.mask.format(field=self._by_value[m.group(0)])) for m in self._pattern.finditer(text)]
        for pattern, field in self._patterns:
            spans += [(m.start(), m.end(), self.mask.format(field=field)) for m in pattern.finditer(text)]
        return apply_spans(text, spans)

    def __call__(self, value: Any) -> Any:
        if not self.fields and self._detector is None:
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
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # A number is masked when it is a listed value; the detectors see only long integers (a card or phone
            # stored as a number), never timestamps, scores or amounts.
            long_int = isinstance(value, int) and abs(value) >= 10**8
            if self._values or self._patterns or long_int:
                masked = self._mask_text(str(value), detect=long_int)
                return value if masked == str(value) else masked
        return value


def _leaf_values(value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        return [x for v in value.values() for x in _leaf_values(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaf_values(v)]
    return [value]


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


# -- the key -----------------------------------------------------------------------------------------------
def _default_key_file() -> Path:
    from agenttune_lib.config import PlatformPaths

    return PlatformPaths.from_env().home / "secrets" / "audit.key"


def _key_file_for(log_path: Path | None) -> Path:
    path = Path(os.environ[AUDIT_KEY_FILE_ENV]) if os.environ.get(AUDIT_KEY_FILE_ENV) else _default_key_file()
    if log_path is not None:
        log_dir = log_path.resolve().parent
        key = path.resolve()
        if key.parent == log_dir:
            raise AuditError(f"audit key file {str(path)!r} lies in the log's folder {str(log_dir)!r}; keep the key apart from the log")
    return path


def load_audit_key(key: bytes | str | None = None, log_path: str | Path | None = None, create: bool = False) -> bytes:
    """The HMAC key: ``key`` if given, else ``$AGENTTUNE_AUDIT_KEY``, else the key file (``$AGENTTUNE_AUDIT_KEY_FILE``
    or ``$AGENTTUNE_HOME/secrets/audit.key``), which a writer (``create``) makes on first use with mode 0600.
    The key never lives in the log's folder: whoever can rewrite the log must not be able to re-sign it."""
    if key is not None:
        raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    elif os.environ.get(AUDIT_KEY_ENV):
        raw = os.environ[AUDIT_KEY_ENV].encode("utf-8")
    else:
        path = _key_file_for(Path(log_path) if log_path is not None else None)
        if not path.exists():
            if not create:
                raise AuditError(
                    f"no audit key: set ${AUDIT_KEY_ENV} or ${AUDIT_KEY_FILE_ENV}, or keep the writer's key file at {str(path)!r}"
                )
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))
        raw = path.read_text(encoding="utf-8").strip().encode("utf-8")
    if len(raw) < 16:
        raise AuditError("the audit key is shorter than 16 bytes")
    return raw


def key_id(key: bytes) -> str:
    """A short public fingerprint of the key (which key signed a line), not the key."""
    return hashlib.sha256(b"agenttune-audit-key-id:" + key).hexdigest()[:16]


def record_mac(record: Mapping[str, Any], key: bytes) -> str:
    """HMAC-SHA256 (keyed) of the canonical JSON of ``record`` without its ``hash`` key."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return hmac.new(key, _canonical(body).encode("utf-8"), hashlib.sha256).hexdigest()


# -- the head checkpoint (outside the log) -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AuditHead:
    """The chain's last committed state: line count, last hash, file size in bytes."""

    count: int
    hash: str
    size: int


class FileHeadStore:
    """Head checkpoints as small JSON files in a folder apart from the logs (for runs without a warehouse)."""

    def __init__(self, folder: str | Path | None = None) -> None:
        if folder is None:
            from agenttune_lib.config import PlatformPaths

            folder = PlatformPaths.from_env().home / "audit_heads"
        self.folder = Path(folder)

    def _file(self, log_id: str) -> Path:
        return self.folder / (hashlib.sha256(log_id.encode("utf-8")).hexdigest()[:32] + ".json")

    def get(self, log_id: str) -> AuditHead | None:
        path = self._file(log_id)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return AuditHead(int(data["count"]), str(data["hash"]), int(data["size"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AuditError(f"audit head checkpoint {str(path)!r} is unreadable: {exc}") from None

    def put(self, log_id: str, head: AuditHead) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._file(log_id)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"log": log_id, **dataclasses.asdict(head), "updated_at": utc_now()}), encoding="utf-8")
        os.replace(tmp, path)


class WarehouseHeadStore:
    """Head checkpoints in the warehouse table ``decide_audit_heads`` (one row per log)."""

    TABLE = "decide_audit_heads"
    DDL = (
        "CREATE TABLE IF NOT EXISTS decide_audit_heads (log_path VARCHAR, count BIGINT, "
        "hash VARCHAR, size BIGINT, updated_at TIMESTAMP)"
    )

    def __init__(self, warehouse: Any) -> None:
        from agenttune_lib.warehouse import Warehouse

        self.warehouse = warehouse if isinstance(warehouse, Warehouse) else Warehouse(warehouse)

    def get(self, log_id: str) -> AuditHead | None:
        if not getattr(self.warehouse, "is_lake", False) and not Path(self.warehouse.path).exists():
            return None
        with self.warehouse.connect() as con:
            self.warehouse.create_tables(con, self.DDL)
            row = con.execute("SELECT count, hash, size FROM decide_audit_heads WHERE log_path = ?", [log_id]).fetchone()
        return AuditHead(int(row[0]), str(row[1]), int(row[2])) if row else None

    def put(self, log_id: str, head: AuditHead) -> None:
        with self.warehouse.connect() as con:
            self.warehouse.create_tables(con, self.DDL)
            # delete + insert in one transaction (no upsert: a DuckLake table has no primary key)
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute("DELETE FROM decide_audit_heads WHERE log_path = ?", [log_id])
                con.execute("INSERT INTO decide_audit_heads VALUES (?, ?, ?, ?, now())", [log_id, head.count, head.hash, head.size])
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise


def head_store(warehouse: Any = None, heads: Any = None, path: str | Path | None = None) -> Any:
    """The head store to use: ``heads`` if given, the warehouse's table when a warehouse is given; otherwise the head
    files under ``$AGENTTUNE_HOME/audit_heads`` — unless they hold no head for ``path`` and the platform warehouse
    does (a log written by Dagster's ``decide_runs``, read or continued from the CLI)."""
    if heads is not None:
        return heads
    if warehouse is not None:
        return WarehouseHeadStore(warehouse)
    files = FileHeadStore()
    if path is not None and files.get(log_id(path)) is None:
        from agenttune_lib.config import PlatformPaths

        platform = PlatformPaths.from_env().warehouse
        if platform.exists():
            try:
                store = WarehouseHeadStore(platform)
                if store.get(log_id(path)) is not None:
                    return store
            except Exception:  # an unreadable platform warehouse: fall back to the head files
                pass
    return files


def log_id(path: str | Path) -> str:
    """The key a log's head is stored under: its absolute path."""
    return str(Path(path).resolve())


def _check_line(record: Any, seq: int, prev: str, key: bytes) -> str | None:
    """Why a parsed line does not continue the chain at ``seq`` after ``prev``, or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if record.get("seq") != seq:
        return f"seq is {record.get('seq')!r}, expected {seq} (a line was deleted or inserted)"
    if record.get("prev_hash") != prev:
        return "prev_hash does not match the previous line's hash (chain broken)"
    if not hmac.compare_digest(str(record.get("hash", "")), record_mac(record, key)):
        return "HMAC mismatch (the line was edited, or the chain was recomputed without the audit key)"
    return None


def rotate_audit(path: str | Path, *, warehouse: Any = None, heads: Any = None, suffix: str | None = None) -> Path:
    """Move a verified log aside to ``<name>.<suffix>`` with its head checkpoint, so the next append starts a new chain.

    The rotated file stays verifiable under its new name; readers follow it (closed loop) by its first line.
    """
    path = Path(path)
    store = head_store(warehouse, heads, path)
    with _locked(path):
        result = verify_audit(path, heads=store)
        if not result.ok:
            raise AuditError(f"audit log {str(path)!r} fails verification; not rotating: {'; '.join(result.problems[:3])}")
        head = store.get(log_id(path))
        target = path.with_name(f"{path.name}.{suffix or datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%fZ')}")
        if target.exists():
            raise AuditError(f"cannot rotate {str(path)!r}: {str(target)!r} already exists")
        os.replace(path, target)
        if head is not None:
            store.put(log_id(target), head)
            store.put(log_id(path), AuditHead(0, GENESIS_HASH, 0))
    return target


class AuditWriter:
    """Appends records to the keyed chain under a file lock and moves the head checkpoint (outside the log).

    ``redact`` masks each record before it is signed. Every append first reconciles the head with the file:
    complete, correctly signed lines past the head (a crash between append and head update) are adopted, a
    torn final line (a crash mid-write) is cut off, and anything else (truncation, foreign lines, a log with
    no head) refuses the append with an AuditError.
    """

    def __init__(
        self, path: str | Path, redact: Callable[[Any], Any] | None = None, key: bytes | str | None = None,
        heads: Any = None, warehouse: Any = None,
    ) -> None:
        self.path = Path(path)
        self.redact = redact
        self._key_arg = key
        self._key: bytes | None = None
        self.heads = head_store(warehouse, heads, self.path)

    @property
    def key(self) -> bytes:
        if self._key is None:
            self._key = load_audit_key(self._key_arg, self.path, create=True)
        return self._key

    def _reconcile(self, log: str) -> AuditHead:
        """The head that matches the file now (see the class docstring); called under the lock."""
        head = self.heads.get(log)
        size = self.path.stat().st_size if self.path.exists() else 0
        if head is None:
            if size:
                raise AuditError(f"audit log {str(self.path)!r} has {size} bytes but no head checkpoint; refusing to append (run verify-audit)")
            return AuditHead(0, GENESIS_HASH, 0)
        if size < head.size:
            raise AuditError(f"audit log {str(self.path)!r} is {size} bytes, shorter than its head checkpoint ({head.size}): truncated")
        if size == head.size:
            return head
        with open(self.path, "rb") as handle:
            handle.seek(head.size)
            tail = handle.read()
        count, prev, good = head.count, head.hash, head.size
        *complete, torn = tail.split(b"\n")
        for raw in complete:
            try:
                record = json.loads(raw.decode("utf-8"))
            except ValueError:
                record = None
            problem = _check_line(record, count, prev, self.key)
            if problem:
                raise AuditError(f"audit log {str(self.path)!r}: line {count + 1} past the head checkpoint does not continue the chain: {problem}")
            count, prev, good = count + 1, record["hash"], good + len(raw) + 1
        if torn:
            with open(self.path, "r+b") as handle:  # an unacknowledged, half-written line
                handle.truncate(good)
                handle.flush()
                os.fsync(handle.fileno())
        reconciled = AuditHead(count, prev, good)
        self.heads.put(log, reconciled)
        return reconciled

    def append(self, record: Mapping[str, Any], redact: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        """Redact, chain, sign and append one record; returns what was written."""
        hook = redact or self.redact
        body = dict(hook(dict(record)) if hook else record)
        body.setdefault("timestamp", utc_now())
        body = json.loads(_canonical(body))
        key = self.key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        log = log_id(self.path)
        with _locked(self.path):
            head = self._reconcile(log)
            body["seq"] = head.count
            body["prev_hash"] = head.hash
            body["key_id"] = key_id(key)
            body.pop("hash", None)
            body["hash"] = record_mac(body, key)
            line = (_canonical(body) + "\n").encode("utf-8")
            with open(self.path, "ab") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
            self._after_append()
            self.heads.put(log, AuditHead(head.count + 1, body["hash"], head.size + len(line)))
        return body

    def _after_append(self) -> None:
        """Between the line's fsync and the head update (crash-injection point for tests)."""


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


def verify_audit(
    path: str | Path, *, key: bytes | str | None = None, heads: Any = None, warehouse: Any = None
) -> AuditVerification:
    """Recompute every HMAC and link and compare the end with the head checkpoint kept outside the log.

    Fails on an edited, inserted, reordered or deleted line, a chain recomputed without the key, a missing head
    checkpoint, a truncated or emptied log. One signed line past the head (a crash before the head update,
    reconciled by the next append) is a warning.
    """
    path = Path(path)
    store = head_store(warehouse, heads, path)
    head = store.get(log_id(path))
    if not path.exists():
        if head is not None:
            return AuditVerification(str(path), False, 0, [f"audit log is missing but its head checkpoint records {head.count} lines"], [])
        raise AuditError(f"audit log {str(path)!r} does not exist")
    secret = load_audit_key(key, path, create=False)
    problems: list[str] = []
    warnings: list[str] = []
    prev = GENESIS_HASH
    count = 0
    sizes: list[int] = [0]
    with open(path, "rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            sizes.append(sizes[-1] + len(raw))
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                problems.append(f"line {lineno}: blank line")
                continue
            if not raw.endswith(b"\n"):
                problems.append(f"line {lineno}: torn final line (no newline)")
            try:
                record = json.loads(line)
            except ValueError as exc:
                problems.append(f"line {lineno}: not JSON ({exc})")
                prev = "<unknown>"
                count += 1
                continue
            problem = _check_line(record, count, prev, secret) if prev != "<unknown>" else None
            if problem:
                problems.append(f"line {lineno}: {problem}")
            prev = record.get("hash", "<unknown>") if isinstance(record, dict) else "<unknown>"
            count += 1
    if count == 0:
        problems.append("the audit log is empty (emptied, or never written)")
    if head is None:
        if count:
            problems.append("no head checkpoint for this log: truncation or replacement cannot be ruled out")
    elif count == head.count + 1 and not problems and sizes[-2] == head.size:
        warnings.append("one signed line past the head checkpoint (an append interrupted before its head update; the next append reconciles it)")
    elif count != head.count:
        problems.append(f"head checkpoint records {head.count} lines, the log has {count} (lines were removed or added at the end)")
    elif prev != head.hash:
        problems.append("head checkpoint's last hash does not match the log's last line")
    elif sizes[-1] != head.size:
        problems.append(f"head checkpoint records {head.size} bytes, the log has {sizes[-1]}")
    return AuditVerification(str(path), not problems, count, problems, warnings)


def require_verified(path: str | Path, **kwargs: Any) -> AuditVerification:
    """``verify_audit`` that raises AuditError naming the problems: for readers (training bridge, closed loop)."""
    result = verify_audit(path, **kwargs)
    if not result.ok:
        raise AuditError(f"audit log {str(path)!r} fails verification: {'; '.join(result.problems[:5])}")
    return result


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
        return extract_dpo_pairs(self.records(), **kwargs)

    def extract_bco_labels(self, **kwargs: Any) -> list[dict[str, Any]]:
        return extract_bco_labels(self.records(), **kwargs)
