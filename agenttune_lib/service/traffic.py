"""Served traffic into the warehouse: each request becomes a full-tier EventLog (``served_adapter_id`` in its metadata),
with PII redacted by the privacy layer before it is stored; feedback rows are kept beside it for the closed loop."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse.store import Provenance

__all__ = ["TrafficRecord", "TrafficRecorder", "served_eventlog", "record_feedback", "FEEDBACK_DDL", "SERVE_SOURCE", "feedback_after"]

#: The warehouse ``source`` of every served request's EventLog.
SERVE_SOURCE = "serve"

FEEDBACK_DDL = """CREATE TABLE IF NOT EXISTS served_feedback (
    seq BIGINT PRIMARY KEY, request_id VARCHAR NOT NULL, reward DOUBLE NOT NULL, thumbs VARCHAR, correction VARCHAR,
    root_cause VARCHAR, comment VARCHAR, served_adapter_id VARCHAR, created_at TIMESTAMPTZ NOT NULL)"""


@dataclasses.dataclass(frozen=True)
class TrafficRecord:
    """What one request was, what it produced, and by which adapter; texts still unredacted (redacted on write)."""

    request_id: str
    requested_model: str
    served_adapter_id: str
    base_model: str
    decision_id: str | None
    messages: list[dict[str, str]]
    completion_text: str
    tool_calls: list[dict[str, Any]]
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    latency_s: float
    stream: bool
    tools: list[str]
    created_at: str
    user: str | None = None
    #: The tools decoding could call (name, description, parameters) and whether they were decoded under their schemas.
    tool_specs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    structured_tool_calls: bool = False
    allow_text: bool = True


def served_eventlog(rec: TrafficRecord, redact: Callable[[str], str] | None, tokenizer: Any = None) -> EventLog:
    """The full-tier EventLog of one served request: the prompt as an OBSERVATION over the prompt tokens, the reply as
    TEXT or TOOL_CALL events over the completion tokens (with logprobs), then TURN_COMPLETE.

    When redaction changes a text, token ids and logprobs would still carry the personal data, so the redacted text is
    re-tokenized (``tokenizer``) and its logprobs dropped; ``metadata.redacted`` says so.
    """
    red = redact or (lambda s: s)
    messages = [{"role": m["role"], "content": red(m["content"])} for m in rec.messages]
    completion = red(rec.completion_text)
    calls = [{"name": c["function"]["name"], "arguments": json.loads(red(c["function"]["arguments"]))} for c in rec.tool_calls]
    changed_prompt = messages != rec.messages
    changed_reply = completion != rec.completion_text
    prompt_ids, completion_ids, logprobs = list(rec.prompt_ids), list(rec.completion_ids), list(rec.logprobs)
    if changed_prompt and tokenizer is not None:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if changed_reply and tokenizer is not None:
        completion_ids, logprobs = list(tokenizer(completion, add_special_tokens=False)["input_ids"]), None
    if (changed_prompt or changed_reply) and tokenizer is None:
        prompt_ids, completion_ids, logprobs = [], [], None
    n_p, n_c = len(prompt_ids), len(completion_ids)
    span_p = (0, n_p) if n_p else None
    span_c = (n_p, n_p + n_c) if n_c else None
    lps = logprobs if (logprobs is not None and span_c and len(logprobs) == n_c) else None
    events = [Event(EventKind.OBSERVATION, {"content": json.dumps(messages, ensure_ascii=False), "messages": messages}, token_span=span_p)]
    if calls:
        events.append(Event(EventKind.TOOL_CALL, {"name": calls[0]["name"], "arguments": calls[0]["arguments"], "text": completion},
                            token_span=span_c, logprobs=lps))
        events.extend(Event(EventKind.TOOL_CALL, {"name": c["name"], "arguments": c["arguments"]}) for c in calls[1:])
    else:
        events.append(Event(EventKind.TEXT, {"content": completion}, token_span=span_c, logprobs=lps))
    events.append(Event(EventKind.TURN_COMPLETE, {"finish_reason": rec.finish_reason}))
    last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    meta = {
        "served_adapter_id": rec.served_adapter_id, "requested_model": rec.requested_model, "base_model": rec.base_model,
        "decision_id": rec.decision_id, "task": last_user, "messages": messages, "completion_text": completion,
        "template_id": "serve:chat", "channel": SERVE_SOURCE, "finish_reason": rec.finish_reason, "latency_s": round(rec.latency_s, 4),
        "stream": rec.stream, "tools": rec.tools, "served_at": rec.created_at, "redacted": bool(changed_prompt or changed_reply),
        "prompt_tokens": len(rec.prompt_ids), "completion_tokens": len(rec.completion_ids),
    }
    if rec.tool_specs:
        meta.update({"tool_specs": rec.tool_specs, "structured_tool_calls": rec.structured_tool_calls, "allow_text": rec.allow_text})
    if rec.user:
        # Provenance: the end user behind the request (the gate limits any one source's share of a retrain batch);
        # without one, each distinct input is its own source, as for DECIDE runs with no source field.
        meta["source"] = f"serve:user:{red(rec.user)}"
    return EventLog(events, tier="full", id=rec.request_id, metadata=meta, token_ids=prompt_ids + completion_ids)


class TrafficRecorder:
    """Writes served EventLogs from a background thread, many per DuckDB transaction; ``flush`` waits until all are in.

    A failed write is retried (the warehouse lock may be held by a Dagster step); nothing is dropped while the process lives.
    """

    def __init__(self, warehouse: Any, redact: Callable[[str], str] | None, tokenizer_for: Callable[[str], Any], flush_every_s: float = 0.2) -> None:
        self.warehouse, self.redact, self.tokenizer_for, self.flush_every_s = warehouse, redact, tokenizer_for, flush_every_s
        self._queue: queue.Queue[TrafficRecord | None] = queue.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self.written = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="agenttune-serve-traffic", daemon=True)
        self._thread.start()

    def submit(self, rec: TrafficRecord) -> None:
        with self._cond:
            self._pending += 1
        self._queue.put(rec)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Block until every submitted record is in the warehouse (feedback on a request needs its log stored)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self._pending} served EventLogs not yet written to {self.warehouse!r} after {timeout_s}s: {self.errors[-1:]}")
                self._cond.wait(left)

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        stop = False
        while not stop:
            recs = []
            item = self._queue.get()
            if item is None:
                return
            recs.append(item)
            deadline = time.monotonic() + self.flush_every_s
            while True:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                recs.append(item)
            self._write([self._build(r) for r in recs])
            with self._cond:
                self._pending -= len(recs)
                self.written += len(recs)
                self._cond.notify_all()

    def _build(self, rec: TrafficRecord) -> EventLog:
        """The request's full-tier log; if building it fails, a light-tier log of the redacted texts (never nothing)."""
        try:
            return served_eventlog(rec, self.redact, self.tokenizer_for(rec.base_model))
        except Exception as exc:  # noqa: BLE001 - one bad record must not stop the writer or lose the request
            self.errors.append(f"{rec.request_id}: {type(exc).__name__}: {exc}")
            red = self.redact or (lambda s: s)
            return EventLog([Event(EventKind.TEXT, {"content": red(rec.completion_text)})], tier="light", id=rec.request_id,
                            metadata={"served_adapter_id": rec.served_adapter_id, "base_model": rec.base_model, "channel": SERVE_SOURCE,
                                      "completion_text": red(rec.completion_text), "build_error": f"{type(exc).__name__}: {exc}",
                                      "messages": [{"role": m["role"], "content": red(m["content"])} for m in rec.messages]})

    def _write(self, logs: Sequence[EventLog]) -> None:
        delay = 0.1
        while True:
            try:
                provs = [Provenance(model_version=log.metadata["base_model"], adapter_version=log.metadata["served_adapter_id"],
                                    asset_key="served_requests") for log in logs]
                self.warehouse.append_logs(list(logs), provenance=provs, source=SERVE_SOURCE)
                return
            except Exception as exc:  # noqa: BLE001 - the warehouse may be locked by another writer: retry, never drop
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(delay)
                delay = min(delay * 2, 5.0)


def record_feedback(warehouse: Any, request_id: str, reward: float, thumbs: str | None, correction: str | None,
                    root_cause: str | None, comment: str | None) -> tuple[int, EventLog]:
    """Store one feedback row (next ``seq``) and the request's EventLog again with an episode REWARD and the judge score.

    An unknown request id is a LookupError naming it.
    """
    logs = warehouse.read_logs(ids=[request_id], source=SERVE_SOURCE)
    if not logs:
        raise LookupError(f"no served request {request_id!r} in the warehouse")
    log = logs[0]
    meta = dict(log.metadata)
    meta.update({"judge_score": float(reward), "feedback_reward": float(reward), "feedback_correction": correction,
                 "feedback_root_cause": root_cause})
    events = [e for e in log.events if not (e.kind is EventKind.REWARD and (e.payload or {}).get("source") == "feedback")]
    events.append(Event(EventKind.REWARD, {"value": float(reward), "source": "feedback"}, scope="episode"))
    updated = EventLog(events, tier=log.tier, id=log.id, metadata=meta, token_ids=log.token_ids)
    now = dt.datetime.now(dt.timezone.utc)
    with warehouse.connect() as con:
        warehouse.create_tables(con, FEEDBACK_DDL)
        con.execute("BEGIN TRANSACTION")
        try:
            seq = int(con.execute("SELECT coalesce(max(seq), 0) + 1 FROM served_feedback").fetchone()[0])
            con.execute("INSERT INTO served_feedback VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [seq, request_id, float(reward), thumbs, correction, root_cause, comment, meta.get("served_adapter_id"), now])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    warehouse.append_logs([updated], provenance=Provenance(model_version=meta.get("base_model"), adapter_version=meta.get("served_adapter_id"),
                                                           asset_key="served_requests"), source=SERVE_SOURCE)
    return seq, updated


def feedback_after(warehouse: Any, seq: int) -> list[tuple]:
    """Feedback rows with ``seq`` past the given one: (seq, request_id, reward, correction, root_cause), in order."""
    if not warehouse.has_table("served_feedback"):
        return []
    return warehouse.execute("SELECT seq, request_id, reward, correction, root_cause FROM served_feedback WHERE seq > ? ORDER BY seq", [seq])
