"""Per-call overhead of an isolated tool: pooled sandbox worker vs in-process, and the first call (worker start).

Run: .venv/bin/python bench/tool_isolation.py [--calls 200]
Prints JSON: median / p90 / mean milliseconds per call for an in-process call, a pooled
isolated call, and the cold first call, plus which protections were active.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from agenttune_lib.tools.base import as_tool
from agenttune_lib.tools.isolation import IsolatedTool
from agenttune_lib.tools.sandbox import SandboxConfig, shutdown_workers


def echo(x: int) -> int:
    """Return x (the cheapest possible tool: what is measured is the isolation)."""
    return x


def _time(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - start) * 1000)
    return out


def _summary(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)
    return {"median_ms": round(statistics.median(ms), 3), "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3), "mean_ms": round(statistics.fmean(ms), 3), "n": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    import tool_isolation  # the tool must be importable by name in the worker, not a __main__ function

    echo_tool = tool_isolation.echo
    plain = as_tool(echo_tool)
    shutdown_workers()
    cold_start = time.perf_counter()
    isolated = IsolatedTool(echo_tool, timeout=30, sandbox=SandboxConfig())
    first = isolated.invoke({"x": -1})
    cold_ms = (time.perf_counter() - cold_start) * 1000
    assert first.ok and first.value == -1, first
    in_process = _time(lambda i: plain.invoke({"x": i}), args.calls)
    pooled = _time(lambda i: isolated.invoke({"x": i}), args.calls)
    print(json.dumps({
        "in_process": _summary(in_process),
        "isolated_pooled": _summary(pooled),
        "isolated_first_call_ms": round(cold_ms, 1),
        "protections": first.metadata.get("sandbox"),
    }, indent=2))
    shutdown_workers()


if __name__ == "__main__":
    main()
