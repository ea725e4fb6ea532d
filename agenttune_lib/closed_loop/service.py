"""The retrain run's closing steps over the warehouse: gate the newest adapter, then deploy or refuse it."""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agenttune_lib.closed_loop.buffer import TrainingBuffer
from agenttune_lib.closed_loop.deploy import AdapterDeployer, Deployment
from agenttune_lib.closed_loop.detector import FailureDetector
from agenttune_lib.closed_loop.gate import (
    DeploymentGate, GateConfig, GateDecision, HoldoutCase, LikelihoodPolicy, build_holdout, record_gate_decision,
)

__all__ = ["candidate_adapter", "warm_start_adapter", "RetrainInputs", "retrain_inputs", "holdout_from_audits", "gate_candidate", "replay_arms", "deploy_decision", "load_policy", "DeployOutcome"]


def candidate_adapter(warehouse: Any, run_id: str | None = None, adapter_id: str | None = None) -> dict[str, Any]:
    """The adapter to gate: by id, else the one this run trained, else the newest in ``adapters``."""
    if not warehouse.has_table("adapters"):
        raise LookupError(f"no adapters table in {warehouse!r}: nothing has been trained yet")
    cols = "adapter_id, path, base_model, algorithm, run_id, created_at"
    if adapter_id:
        rows = warehouse.execute(f"SELECT {cols} FROM adapters WHERE adapter_id = ?", [adapter_id])
    else:
        rows = warehouse.execute(f"SELECT {cols} FROM adapters WHERE run_id = ? ORDER BY created_at DESC LIMIT 1", [run_id]) if run_id else []
        rows = rows or warehouse.execute(f"SELECT {cols} FROM adapters ORDER BY created_at DESC LIMIT 1")
    if not rows:
        raise LookupError(f"no adapter {adapter_id or ''!r} in {warehouse!r}")
    return dict(zip(["adapter_id", "path", "base_model", "algorithm", "run_id", "created_at"], rows[0]))


def warm_start_adapter(warehouse: Any, deployer: AdapterDeployer, base_model: str) -> tuple[Deployment | None, str]:
    """What a closed-loop retrain continues: the serving adapter when it was trained on ``base_model``; else None, and why.

    Retraining a fresh LoRA on the batch alone would drop what the serving adapter learned in earlier rounds, and the
    gate compares the candidate against that adapter.
    """
    serving = deployer.current()
    if serving is None:
        return None, "no adapter is deployed: the retrain starts a fresh LoRA on the base model"
    if not (Path(serving.path) / "adapter_config.json").exists():
        return None, f"the deployed adapter {serving.adapter_id!r} has no adapter directory at {serving.path!r}: starting fresh"
    rows = warehouse.execute("SELECT base_model FROM adapters WHERE adapter_id = ?", [serving.adapter_id]) if warehouse.has_table("adapters") else []
    if rows and rows[0][0] != base_model:
        return None, f"the deployed adapter {serving.adapter_id!r} was trained on {rows[0][0]!r}, not {base_model!r}: starting fresh"
    return serving, f"continuing the deployed adapter {serving.adapter_id!r}"


@dataclasses.dataclass(frozen=True)
class RetrainInputs:
    """What a closed-loop retrain trains on: the batch's rows for ``algorithm``, and the adapter it continues."""

    batch_id: str
    algorithm: str
    rows: list[dict[str, Any]]
    parent: Deployment | None
    notes: tuple[str, ...]


def retrain_inputs(warehouse: Any, batch_id: str, algorithm: str, warm_start: bool, deployer: AdapterDeployer,
                   base_model: str) -> RetrainInputs:
    """The retrain batch's rows (DPO/BCO preference or label rows, GRPO multi-completion rows; never teacher
    trajectories as a fallback: a ValueError says why none fit) and, with ``warm_start``, the deployed adapter."""
    from agenttune_lib.closed_loop.buffer import retrain_rows

    batch = TrainingBuffer(warehouse).read_batch(batch_id)
    rows = retrain_rows(batch, algorithm)
    notes = [f"retrain batch {batch_id}: {len(rows)} {algorithm} rows from {len(batch.accepted)} accepted examples"]
    parent = None
    if warm_start:
        parent, why = warm_start_adapter(warehouse, deployer, base_model)
        notes.append(f"retrain batch {batch_id}: {why}")
    return RetrainInputs(batch_id, algorithm, rows, parent, tuple(notes))


def holdout_from_audits(audit_files: Sequence[str | Path], examples: Sequence[Any] = (), system_prompt: str | None = None) -> list[HoldoutCase]:
    """Held-out cases from every successful run in the audit logs, minus the training batch's inputs."""
    detector = FailureDetector()
    runs = [r for path in audit_files if Path(path).exists() for r in detector.read_audit(path, 0).runs]
    return build_holdout(runs, exclude=examples, distractors=[e.rejected for e in examples], detector=detector, system_prompt=system_prompt)


def base_checkpoint(base_model: str, adapter_path: str | Path) -> Path:
    """The base checkpoint directory: ``base_model`` when it is one, else the one PEFT recorded in the adapter's config."""
    if (Path(base_model) / "config.json").exists():
        return Path(base_model)
    meta = Path(adapter_path) / "agenttune_adapter.json"
    if meta.exists():
        recorded = json.loads(meta.read_text(encoding="utf-8")).get("base_model_path")
        if recorded and (Path(recorded) / "config.json").exists():
            return Path(recorded)
    cfg = Path(adapter_path) / "adapter_config.json"
    if cfg.exists():
        recorded = json.loads(cfg.read_text(encoding="utf-8")).get("base_model_name_or_path")
        if recorded and (Path(recorded) / "config.json").exists():
            return Path(recorded)
    raise FileNotFoundError(f"base model {base_model!r} of adapter {str(adapter_path)!r} is not a checkpoint directory, "
                            f"and the adapter's config names none that exists")


def load_policy(base_model_path: str | Path, adapter_path: str | Path | None) -> LikelihoodPolicy:
    """A base checkpoint (plus a LoRA adapter when given) as a held-out-case policy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = Path(base_model_path)
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"base model {str(base)!r} is not a checkpoint directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    if adapter_path is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_path))
    return LikelihoodPolicy(model, tokenizer)


def _trajectory_means(warehouse: Any, adapter_id: str | None) -> dict[str, Any] | None:
    if not warehouse.has_table("evaluation_reports"):
        return None
    from agenttune_lib.evaluation.report_model import latest_report

    if adapter_id is None:
        rows = warehouse.execute("SELECT adapter_id FROM evaluation_reports WHERE adapter_id LIKE 'base:%' ORDER BY created_at DESC LIMIT 1")
        if not rows:
            return None
        adapter_id = rows[0][0]
    report = latest_report(warehouse, adapter_id)
    return dict(report.trajectory_means) if report is not None else None


def _comparisons(warehouse: Any, adapter_id: str) -> list[dict[str, Any]]:
    """Every paired held-out comparison stored for the candidate, across all its evaluation reports; [] when none."""
    from agenttune_lib.evaluation.store import candidate_comparisons

    return candidate_comparisons(warehouse, adapter_id)


def decide_model_for(base: str | Path, adapter_path: str | Path | None) -> Any:
    """A DECIDE backend over base + adapter (uncached: the gate loads the baseline and the candidate side by side)."""
    from agenttune_lib.decide.models import TransformersModel
    from agenttune_lib.models.serving import load_served

    model, tokenizer = load_served(base, adapter_path)
    return TransformersModel(model=model, tokenizer=tokenizer)


def _replay_arm(base: str, adapter_path: str | None, cases: Sequence[Any]) -> list[dict[str, Any]]:
    """One arm of the gate's replay: ``cases`` through their templates with base + adapter (a process pool's task)."""
    from agenttune_lib.closed_loop.replay import replay_cases

    return replay_cases(decide_model_for(base, adapter_path), cases)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def replay_arms(base: str | Path, old_adapter: str | Path | None, new_adapter: str | Path, cases: Sequence[Any],
                workers: int = 2) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(baseline outcomes, candidate outcomes) of ``cases``; with ``workers`` >= 2 and two usable CPUs, the two arms run
    at once in two spawned processes. Each DECIDE call runs on one torch thread, so an arm gives the same outcomes in a
    process of its own as in turn with the other, in about half the wall time."""
    if not cases:
        return [], []
    args = [(str(base), str(a) if a else None, list(cases)) for a in (old_adapter, new_adapter)]
    if workers >= 2 and _usable_cpus() >= 2:
        import logging
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        try:
            # spawn: a fork of this process would copy torch's thread pools and whatever locks they hold
            with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
                old, new = (pool.submit(_replay_arm, *a) for a in args)
                return old.result(), new.result()
        except BrokenProcessPool as exc:  # e.g. a __main__ that cannot be re-imported (stdin): the same replay, in turn
            logging.getLogger(__name__).warning("gate replay: the two-process pool failed (%s); replaying the arms in turn", exc)
    return _replay_arm(*args[0]), _replay_arm(*args[1])


def gate_replay_cases(audit_files: Sequence[str | Path], examples: Sequence[Any], holdout_size: int, detector: FailureDetector | None = None) -> list:
    """The batch's failing inputs plus a fixed-size held-out sample of successful runs (corrected stages' outputs and verdicts)."""
    from agenttune_lib.closed_loop.replay import failure_cases, holdout_cases

    detector = detector or FailureDetector()
    runs = [r for path in audit_files if Path(path).exists() for r in detector.read_audit(path, 0).runs]
    failed = {f.trajectory_id for f in detector.detect(runs)}
    stages = {e.metadata.get("stage") for e in examples if e.metadata.get("stage")}
    ok = [r for r in runs if r.trajectory_id not in failed]
    return failure_cases(examples) + holdout_cases(ok, examples, stages, holdout_size)


def gate_candidate(
    warehouse: Any,
    deployer: AdapterDeployer,
    audit_files: Sequence[str | Path],
    buffer: TrainingBuffer | None = None,
    batch_id: str | None = None,
    run_id: str | None = None,
    adapter_id: str | None = None,
    config: GateConfig | None = None,
    base_path: str | Path | None = None,
) -> GateDecision:
    """Gate the candidate against what serves now (or the bare base model) and store the decision.

    Generative: the batch's failing inputs and a fixed-size held-out sample are replayed through
    their DECIDE templates with the baseline and the candidate (served-traffic failures through their
    conversation, expecting the reviewer's correction); the evaluation report's paired
    comparisons, the trajectory metrics and the batch's provenance are the other arms.
    """
    config = config or GateConfig()
    cand = candidate_adapter(warehouse, run_id, adapter_id)
    batch = buffer.read_batch(batch_id) if (buffer is not None and batch_id) else None
    examples = batch.accepted if batch is not None else []
    cases = gate_replay_cases(audit_files, examples, config.holdout_size)
    serving = deployer.current()
    base = Path(base_path) if base_path else base_checkpoint(cand["base_model"], cand["path"])
    old, new = replay_arms(base, serving.path if serving else None, cand["path"], cases, config.replay_workers)
    # Served-traffic failures (feedback with a correction) replay generatively through the served conversation.
    from agenttune_lib.closed_loop.served_replay import served_failure_outcomes

    old += served_failure_outcomes(base, serving.path if serving else None, examples)
    new += served_failure_outcomes(base, cand["path"], examples)
    decision = DeploymentGate(config).evaluate_decision(
        examples=batch.examples if batch is not None else [], replay_old=old, replay_new=new,
        comparisons=_comparisons(warehouse, cand["adapter_id"]),
        trajectory_old=_trajectory_means(warehouse, serving.adapter_id if serving else None),
        trajectory_new=_trajectory_means(warehouse, cand["adapter_id"]),
        candidate=cand["adapter_id"], baseline=serving.adapter_id if serving else None, batch_id=batch_id,
        candidate_kind=str(cand.get("algorithm") or "distill"),
    )
    decision.arms["replay"]["cases"] = {"old": old, "new": new}
    record_gate_decision(warehouse, decision, run_id)
    return decision


@dataclasses.dataclass(frozen=True)
class DeployOutcome:
    """What serves after the deploy step, what served before, and the decision behind it."""

    deployed: bool
    serving: Deployment | None
    previous: str | None
    decision_id: str
    reason: str


def deploy_decision(
    warehouse: Any, deployer: AdapterDeployer, decision: GateDecision, buffer: TrainingBuffer | None = None, run_id: str | None = None
) -> DeployOutcome:
    """Deploy an approved candidate atomically, or keep the serving adapter; then close the retrain batch."""
    before = deployer.current()
    if decision.approved:
        cand = candidate_adapter(warehouse, adapter_id=decision.candidate)
        dep = deployer.apply_decision(decision, cand["path"], adapter_id=cand["adapter_id"], run_id=run_id)
        outcome = DeployOutcome(True, dep, before.adapter_id if before else None, decision.decision_id, "approved by the gate")
    else:
        outcome = DeployOutcome(False, before, before.adapter_id if before else None, decision.decision_id, "; ".join(decision.reasons))
    if buffer is not None and decision.batch_id:
        stats = buffer.stats()
        if stats.retrain_batch == decision.batch_id:
            # A refused candidate closes its batch as refused, not succeeded (its examples are not requeued to retrain on forever).
            buffer.finish_retrain(decision.batch_id, succeeded=decision.approved, refused=not decision.approved)
        if decision.approved:
            buffer.reset_reward_baseline()
    return outcome
