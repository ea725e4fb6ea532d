"""DECIDE runs on the packaged base model: one torch intra-op thread vs torch's default, quiet and beside a CPU hog.

Runs what ``decide_runs`` runs for one partition (the template's labelled example rows, no retries, 10 steps,
reviews fail closed, no destinations) with ``TransformersModel(num_threads=1)`` and ``num_threads=None``
(torch's default: one thread per core), first on a quiet machine, then beside a one-thread busy loop started in its
own session (its own scheduler autogroup, so it takes an equal share as another user's process would). Prints the
seconds of each arm, the ratios side by side, and whether the verdicts are the same.

    AGENTTUNE_HOME=$PWD/.agenttune .venv/bin/python bench/decide_threads.py --template bfsi/kyc_triage --limit 6
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_arm(template_id: str, limit: int, checkpoint: Path, num_threads: int | None) -> tuple[float, list[str | None]]:
    """Seconds for the template's first ``limit`` labelled rows, and their verdict labels."""
    from agenttune_lib.decide import GraphRunner, TemplateRegistry, TransformersModel

    template = TemplateRegistry().get(template_id)
    rows = [r for r, _ in template.labelled_examples[:limit]]
    model = TransformersModel(checkpoint, max_new_tokens=24, num_threads=num_threads)
    model._load()  # load outside the timed part, as the asset's process does before its runs
    with tempfile.TemporaryDirectory() as tmp:
        runner = GraphRunner(template, model=model, audit=Path(tmp) / "audit.jsonl", review_dir=Path(tmp) / "reviews",
                             human_review_timeout=0.0, max_retries=0, max_steps=10, destinations=[])
        t0 = time.perf_counter()
        states = [runner.run(row) for row in rows]
        seconds = time.perf_counter() - t0
    return seconds, [(s.verdict or {}).get("label") for s in states]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--template", default="bfsi/kyc_triage")
    ap.add_argument("--limit", type=int, default=6, help="labelled example rows of the template")
    ap.add_argument("--no-hog", action="store_true", help="quiet arms only")
    args = ap.parse_args()
    import torch

    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.models.base import ensure_base_model

    info = ensure_base_model(PlatformPaths.from_env().ensure().models)
    default_threads = torch.get_num_threads()
    out: dict[str, dict] = {}
    loads = ["quiet"] if args.no_hog else ["quiet", "hog"]
    for load in loads:
        hog = None
        if load == "hog":
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        try:
            for threads in (1, None):
                label = f"{load}/threads={threads or default_threads}"
                seconds, verdicts = run_arm(args.template, args.limit, info.path, threads)
                out[label] = {"seconds": round(seconds, 1), "runs": len(verdicts), "verdicts": verdicts}
                print(label, json.dumps(out[label]), flush=True)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    ratios = {load: round(out[f"{load}/threads={default_threads}"]["seconds"] / out[f"{load}/threads=1"]["seconds"], 2) for load in loads}
    same = len({json.dumps(v["verdicts"]) for v in out.values()}) == 1
    print(json.dumps({"template": args.template, "default_threads": default_threads,
                      "default_over_one_thread": ratios, "same_verdicts": same}, indent=1))


if __name__ == "__main__":
    main()
