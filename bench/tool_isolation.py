"""Per-call overhead of an isolated tool: a fresh bubblewrap sandbox per call at each level vs in process.

Run: .venv/bin/python bench/tool_isolation.py [--calls 50]
Prints JSON: median / p90 / mean milliseconds per call in process and at each sandbox level
(``strict``, ``no-seccomp``, ``rlimits-only``), plus what the strict sandbox verified.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from agenttune_lib.tools.base import as_tool
from agenttune_lib.tools.isolation import IsolatedTool
from agenttune_lib.tools.sandbox import LEVELS


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
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    import tool_isolation  # the tool must be importable by name in the sandbox, not a __main__ function

    echo_tool = tool_isolation.echo
    plain = as_tool(echo_tool)
    report: dict = {"in_process": _summary(_time(lambda i: plain.invoke({"x": i}), args.calls))}
    for level in LEVELS:
        isolated = IsolatedTool(echo_tool, timeout=30, level=level)
        first = isolated.invoke({"x": -1})
        if not first.ok:
            report[level] = {"refused": first.error.get("message")}
            continue
        report[level] = _summary(_time(lambda i: isolated.invoke({"x": i}), args.calls))
        if level == "strict":
            report["strict_verified"] = first.metadata["sandbox"]["verified"]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
