"""Bounded load on `agenttune serve` over loopback: N concurrent clients send a bounded number of chat completions to a
real uvicorn server over the tiny model; prints p50/p99 latency and requests/s, and checks that every request's
EventLog is in the warehouse (none lost, each naming its adapter).

    PYTHONPATH=. .venv/bin/python bench/serve_load.py --clients 32 --requests 320 --max-tokens 16
    PYTHONPATH=. .venv/bin/python bench/serve_load.py --clients 32 --requests 320 --max-tokens 16 --max-batch 1   # no batching
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=320)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--no-redact", action="store_true", help="skip Presidio redaction of stored traffic")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the engine (one is fastest on a shared CPU)")
    args = ap.parse_args()

    import httpx

    from _service_helpers import free_port, running_service
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.service import ServiceConfig
    from agenttune_lib.warehouse import Warehouse

    tmp = Path(tempfile.mkdtemp(prefix="serve-load-"))
    base = save_tiny_model(tmp / "tiny")
    config = ServiceConfig(base_path=base, deploy_root=tmp / "deployed", warehouse_path=str(tmp / "wh.duckdb"), port=free_port(),
                           redact=not args.no_redact, max_batch=args.max_batch, num_threads=args.threads,
                           max_completion_tokens=max(64, args.max_tokens), default_max_tokens=args.max_tokens)
    ids: list[str] = []
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(args.requests))

    with running_service(config) as (url, app):
        httpx.post(url + "/v1/chat/completions", json={"model": "deployed", "messages": [{"role": "user", "content": "warm up"}]},
                   timeout=120).raise_for_status()
        app.state.service.recorder.flush()
        app.state.service.engine.batches.clear()

        def client(worker: int) -> None:
            with httpx.Client(timeout=300) as http:
                while True:
                    with lock:
                        i = next(counter, None)
                    if i is None:
                        return
                    t0 = time.perf_counter()
                    r = http.post(url + "/v1/chat/completions", json={
                        "model": "deployed", "max_tokens": args.max_tokens,
                        "messages": [{"role": "user", "content": f"client {worker} request {i}: what is the status of order W{i:04d}?"}]})
                    dt = time.perf_counter() - t0
                    with lock:
                        if r.status_code == 200:
                            ids.append(r.json()["id"])
                            lat.append(dt)
                        else:
                            errors.append(f"{r.status_code} {r.text[:200]}")

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(client, range(args.clients)))
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        app.state.service.recorder.flush(timeout_s=600)
        flush_s = time.perf_counter() - t1
        batches = list(app.state.service.engine.batches)
    wh = Warehouse(config.warehouse_path)
    stored = {row[0]: row[1] for row in wh.execute(
        "SELECT id, json_extract_string(metadata, '$.served_adapter_id') FROM trajectories WHERE source = 'serve'")}
    missing = [i for i in ids if i not in stored]
    out = {
        "clients": args.clients, "requests": args.requests, "ok": len(ids), "errors": len(errors), "max_tokens": args.max_tokens,
        "max_batch": args.max_batch, "redact": not args.no_redact, "wall_s": round(wall, 2), "req_per_s": round(len(ids) / wall, 2),
        "p50_s": round(_pct(lat, 0.50), 3), "p99_s": round(_pct(lat, 0.99), 3), "max_s": round(max(lat), 3),
        "mean_batch": round(sum(batches) / len(batches), 2) if batches else 0, "generate_calls": len(batches),
        "stored_eventlogs": len(stored) - 1, "missing_eventlogs": len(missing), "flush_after_load_s": round(flush_s, 2),
        "adapters_named": sorted(set(stored.values())),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out, indent=1))
    if errors:
        print("first errors:", errors[:3], file=sys.stderr)
    if missing or errors or len(ids) != args.requests:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
