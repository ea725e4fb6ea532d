"""Wall-clock of the README's main job, per asset, on the embedded default.

Materializes the whole graph into a fresh AGENTTUNE_HOME (so nothing is cached from an
earlier run) and prints each step's seconds, slowest first, so a slow asset is visible.
Usage: .venv/bin/python bench/main_job.py [--home DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--home", default=None, help="AGENTTUNE_HOME to use (default: a fresh temporary directory)")
    args = parser.parse_args()
    home = Path(args.home or tempfile.mkdtemp(prefix="agenttune_bench_"))
    env = {**os.environ, "AGENTTUNE_HOME": str(home)}
    env.pop("DAGSTER_HOME", None)
    out = home / "main_job.json"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "agenttune_assets.cli", "materialize", "--json", str(out)],
        env=env, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
    )
    total = time.monotonic() - t0
    if not out.exists():
        sys.stderr.write(proc.stdout[-5000:] + proc.stderr[-5000:])
        raise SystemExit(f"main job produced no report (exit {proc.returncode})")
    report = json.loads(out.read_text())
    print(f"main job: {'SUCCESS' if report['success'] else 'FAILURE'}  wall-clock {total:.1f}s  (budget 600s, ratio {total / 600:.2f})")
    for step in sorted(report["steps"], key=lambda s: -(s["seconds"] or 0)):
        print(f"  {step['step']:<34} {step['status']:<9} {step['seconds']}s")
    for part in report.get("partitions", []):
        print(f"  {part['asset']}[{part['partition']}]  {'SUCCESS' if part['success'] else 'FAILURE'}")
    raise SystemExit(0 if report["success"] else 1)


if __name__ == "__main__":
    main()
