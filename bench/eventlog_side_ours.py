"""Our side of ``bench/eventlog_ingest.py --agenttune-python``: the same operations as ``eventlog_agenttune113.py``.

Runs in its own fresh process, as AgentTune's side does, and imports the warehouse (duckdb, pyarrow) only
after the EventLog figures are taken, as AgentTune's side loads only its events module for those. Prints one
JSON object. Usage: python bench/eventlog_side_ours.py --logs 2000 --reads 2000
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import tempfile
import time
from pathlib import Path

from agenttune_lib.events import Event, EventKind, EventLog

EVENTS_PER_LOG = 50


def _record(out: dict[str, float], key: str, n: float, t0: float, c0: float) -> None:
    """``n`` per second of wall clock under ``key`` and per second of this process's CPU time under ``cpu:<key>``.

    On a shared machine the wall clock also counts waiting for a core, and the two sides run one after the
    other under whatever load there is then; CPU time counts only the work (all of DuckDB's threads included).
    """
    out[key] = n / (time.perf_counter() - t0)
    out[f"cpu:{key}"] = n / (time.process_time() - c0)


def generate_full(n_logs: int, per_log: int = EVENTS_PER_LOG, Event=Event, EventLog=EventLog) -> list[EventLog]:  # noqa: N803
    """The side-by-side episodes: full tier with token spans over ``token_ids`` (the shape AgentTune's side builds).

    ``Event``/``EventLog`` may be other classes with the same constructor (the floor measurement's plain dataclasses).
    """
    logs = []
    for i in range(n_logs):
        evs, cursor, j = [Event(EventKind.OBSERVATION, {"content": f"Find clause {i} in the agreement."})], 0, 0
        while len(evs) < per_log - 2:
            evs.append(Event(EventKind.REASONING, {"content": f"Search step {j} for clause {i}."}, token_span=(cursor, cursor + 4)))
            evs.append(Event(EventKind.TOOL_CALL, {"name": "search_corpus", "arguments": {"query": f"clause {i} part {j}", "k": 8}},
                             token_span=(cursor + 4, cursor + 8)))
            evs.append(Event(EventKind.TOOL_RESULT, {"name": "search_corpus", "content": f"[chunk {i}-{j}] The licensee shall ..."}))
            cursor += 8
            j += 1
        evs = evs[: per_log - 2]
        evs.append(Event(EventKind.TEXT, {"content": f"Clause {i} is in section {i % 17}."}, token_span=(cursor, cursor + 4)))
        evs.append(Event(EventKind.REWARD, {"value": (i % 5) / 4}, scope="episode"))
        logs.append(EventLog(evs, tier="full", id=f"bench-{i}", token_ids=list(range(cursor + 4))))
    return logs


@dataclasses.dataclass
class _PlainEvent:
    kind: EventKind
    payload: dict
    token_span: tuple[int, int] | None = None
    logprobs: tuple[float, ...] | None = None
    scope: str | None = None
    author: str | None = None


@dataclasses.dataclass
class _PlainLog:
    events: list
    tier: str = "light"
    id: str = ""
    token_ids: list | None = None


def _floor_build(out: dict[str, float], n_logs: int) -> None:
    """The same episodes built with plain dataclasses (AgentTune's kind of Event: no validation, no copies): the
    loop's own cost, the floor under building EventLogs."""
    t0, c0 = time.perf_counter(), time.process_time()
    built = generate_full(n_logs, Event=_PlainEvent, EventLog=_PlainLog)
    _record(out, "floor_build_events_per_s", sum(len(log.events) for log in built), t0, c0)
    del built
    gc.collect()


def _floor_to_eval_dict(out: dict[str, float], logs: list[EventLog]) -> None:
    """Our ``to_eval_dict`` with its private copy replaced by a reference (``_copy_out`` as identity):
    the cost of the fields it returns, the floor under it while it returns them."""
    import agenttune_lib.events as events_module

    saved = events_module._copy_out
    events_module._copy_out = lambda value: value
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        for log in logs:
            log.to_eval_dict()
        _record(out, "floor_to_eval_dict_logs_per_s", len(logs), t0, c0)
    finally:
        events_module._copy_out = saved


def bench_side_ours(tmp: Path, n_logs: int, reads: int) -> dict[str, float]:
    """Our half of the side-by-side table (same operations as bench/eventlog_agenttune113.py)."""
    out: dict[str, float] = {}
    _floor_build(out, n_logs)  # first, on a heap as empty as AgentTune's side starts with; then let go
    t0, c0 = time.perf_counter(), time.process_time()
    logs = generate_full(n_logs)
    n_events = sum(len(log) for log in logs)
    _record(out, "build_events_per_s", n_events, t0, c0)
    for name, fn in (("to_eval_dict", lambda log: log.to_eval_dict()), ("to_audit_records", lambda log: log.to_audit_records()),
                     ("as_dataset_rows_sft", lambda log: log.as_dataset_rows("sft"))):
        t0, c0 = time.perf_counter(), time.process_time()
        for log in logs:
            fn(log)
        _record(out, f"{name}_logs_per_s", len(logs), t0, c0)
    _floor_to_eval_dict(out, logs)
    from agenttune_lib.warehouse import Provenance, Warehouse  # after the EventLog figures: see the docstring

    wh = Warehouse(tmp / "side.duckdb")
    wh.tables()
    t0, c0 = time.perf_counter(), time.process_time()
    wh.append_logs(logs, provenance=Provenance(run_id="bench"))
    _record(out, "store_events_per_s", n_events, t0, c0)
    ids = [logs[(i * 7919) % len(logs)].id for i in range(reads)]
    single = ids[: max(1, reads // 20)]
    t0, c0 = time.perf_counter(), time.process_time()
    for i in single:
        wh.get_log(i)
    _record(out, "read_by_id_single_logs_per_s", len(single), t0, c0)
    t0, c0 = time.perf_counter(), time.process_time()
    got = 0
    for k in range(0, len(ids), 500):
        got += len(wh.read_logs(ids=ids[k : k + 500]))
    _record(out, "read_by_id_logs_per_s", len(ids), t0, c0)
    t0, c0 = time.perf_counter(), time.process_time()
    path = tmp / "side.jsonl"
    with path.open("w") as fh:
        for log in logs:
            fh.write(log.to_json() + "\n")
    with path.open() as fh:
        back = [EventLog.from_json(line) for line in fh]
    _record(out, "jsonl_write_reparse_events_per_s", sum(len(b) for b in back), t0, c0)
    out["events"] = n_events
    return {k: round(v, 1) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs", type=int, default=2000)
    parser.add_argument("--reads", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(bench_side_ours(Path(tmp), args.logs, args.reads)))


if __name__ == "__main__":
    main()
