"""AgentTune 1.1.3's side of ``bench/eventlog_ingest.py --agenttune-python``: its EventLog and SQLite TrajectoryStore.

Runs under the Python that has ``agenttune==1.1.3`` installed (3.12, ``--no-deps``), or under any Python with
``--root <its agenttune directory>``: only the two stdlib-only modules are loaded, by file path, so none of the
package's heavy imports run, and they run unchanged on 3.11. Prints one JSON object.
Usage: python bench/eventlog_agenttune113.py --logs 2000 --events-per-log 50 --reads 2000 [--root DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path


def _record(out: dict[str, float], key: str, n: float, t0: float, c0: float) -> None:
    """``n`` per second of wall clock under ``key`` and per second of this process's CPU time under ``cpu:<key>``.

    On a shared machine the wall clock also counts waiting for a core, and the two sides run one after the
    other under whatever load there is then; CPU time counts only the work (all of DuckDB's threads included).
    """
    out[key] = n / (time.perf_counter() - t0)
    out[f"cpu:{key}"] = n / (time.process_time() - c0)


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _root(given: str | None) -> Path:
    """The installed agenttune package: found by this Python, or ``--root`` (its directory, for another Python)."""
    if given:
        return Path(given)
    spec = importlib.util.find_spec("agenttune")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("agenttune (1.1.3) is not installed in this Python")
    return Path(list(spec.submodule_search_locations)[0])


def build(ev, n_logs: int, per_log: int):
    """The same episode shape as ours: observation, (reasoning, call, result)*, text, reward; full tier with spans."""
    logs = []
    for i in range(n_logs):
        events, cursor = [ev.Event(ev.EventKind.OBSERVATION, {"text": f"Find clause {i} in the agreement."})], 0
        j = 0
        while len(events) < per_log - 2:
            events.append(ev.Event(ev.EventKind.REASONING, {"text": f"Search step {j} for clause {i}."}, token_span=(cursor, cursor + 4)))
            events.append(ev.Event(ev.EventKind.TOOL_CALL, {"action": {"name": "search_corpus", "arguments": {"query": f"clause {i} part {j}", "k": 8}}},
                                   token_span=(cursor + 4, cursor + 8)))
            events.append(ev.Event(ev.EventKind.TOOL_RESULT, {"output": f"[chunk {i}-{j}] The licensee shall ..."}))
            cursor += 8
            j += 1
        events = events[: per_log - 2]
        events.append(ev.Event(ev.EventKind.TEXT, {"text": f"Clause {i} is in section {i % 17}."}, token_span=(cursor, cursor + 4)))
        events.append(ev.Event(ev.EventKind.REWARD, {"value": (i % 5) / 4}, scope="episode"))
        logs.append(ev.EventLog(events=events, tier="full", id=f"bench-{i}"))
    return logs


def to_record(ts, log):
    """One TrajectoryRecord per log: every event becomes a step (tool calls also a tool_calls row), as its store expects."""
    steps = []
    for n, e in enumerate(log.events):
        step = {"step_number": n, "thought": e.payload.get("text", ""), "observation": str(e.payload.get("output", ""))}
        action = e.payload.get("action")
        if action:
            step.update(action_name=action["name"], action_args=action["arguments"], is_tool_step=True,
                        tool_calls=[{"tool_name": action["name"], "query": action["arguments"]["query"], "result": ""}])
        steps.append(step)
    return ts.TrajectoryRecord(trajectory_id=log.id, run_id="bench", question=log.events[0].payload["text"],
                               final_answer=log.events[-2].payload["text"], reward=log.events[-1].payload["value"], steps=steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs", type=int, default=2000)
    parser.add_argument("--events-per-log", type=int, default=50)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--root", default=None, help="the agenttune package directory, to run its modules under this Python")
    args = parser.parse_args()
    root = _root(args.root)
    ev = _load("at113_events", root / "agentic" / "events.py")
    ts = _load("at113_store", root / "rag" / "storage" / "trajectory_store.py")
    out: dict[str, float] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    logs = build(ev, args.logs, args.events_per_log)
    n_events = sum(len(log) for log in logs)
    _record(out, "build_events_per_s", n_events, t0, c0)
    for name, fn in (("to_eval_dict", lambda log: log.to_eval_dict()), ("to_audit_records", lambda log: log.to_audit_records()),
                     ("as_dataset_rows_sft", lambda log: log.as_dataset_rows("sft"))):
        t0, c0 = time.perf_counter(), time.process_time()
        for log in logs:
            fn(log)
        _record(out, f"{name}_logs_per_s", len(logs), t0, c0)
    with tempfile.TemporaryDirectory() as tmp:
        store = ts.TrajectoryStore(str(Path(tmp) / "traj.db"))
        t0, c0 = time.perf_counter(), time.process_time()
        for log in logs:
            store.store(to_record(ts, log))
        _record(out, "store_events_per_s", n_events, t0, c0)
        ids = [logs[(i * 7919) % len(logs)].id for i in range(args.reads)]
        t0, c0 = time.perf_counter(), time.process_time()
        for i in ids:
            assert store.get_full_trajectory(i) is not None
        _record(out, "read_by_id_logs_per_s", len(ids), t0, c0)
        # Like for like with our JSONL path: Python objects -> JSON lines -> Python objects.
        path = Path(tmp) / "logs.jsonl"
        t0, c0 = time.perf_counter(), time.process_time()
        with path.open("w") as fh:
            for log in logs:
                d = dataclasses.asdict(log)
                for e in d["events"]:
                    e["kind"] = e["kind"].value
                fh.write(json.dumps(d) + "\n")
        with path.open() as fh:
            back = []
            for line in fh:
                d = json.loads(line)
                events = [ev.Event(ev.EventKind(e["kind"]), e["payload"], tuple(e["token_span"]) if e["token_span"] else None,
                                   e["logprobs"], e["scope"]) for e in d["events"]]
                back.append(ev.EventLog(events=events, tier=d["tier"], id=d["id"]))
        _record(out, "jsonl_write_reparse_events_per_s", sum(len(b) for b in back), t0, c0)
    out["events"] = n_events
    print(json.dumps({k: round(v, 1) for k, v in out.items()}))


if __name__ == "__main__":
    main()
