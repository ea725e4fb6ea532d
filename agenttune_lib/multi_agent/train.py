"""train_multi_agent: one GRPO run over a spec'd AgentTuneGraph, with lineage and per-agent/per-judge attribution."""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agenttune_lib.events import EventLog
from agenttune_lib.multi_agent.spec import GraphSpec

__all__ = ["MultiAgentResult", "train_multi_agent", "attribution", "attribution_problems", "score_summary", "prompt_rows"]


@dataclasses.dataclass
class MultiAgentResult:
    """The adapter, the graph it was trained through, and every judge's score distribution."""

    adapter_id: str
    adapter_dir: Path
    base_model: str
    data_version: str
    trajectory_ids: list[str]
    judge_scores: dict[str, list[float]]
    routes: list[str]
    loss_curve: list[float]
    reward_curve: list[float]
    graph: dict[str, Any]
    seconds: float
    node_seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def metrics(self) -> dict[str, Any]:
        return {
            "first_loss": self.loss_curve[0] if self.loss_curve else None,
            "final_loss": self.loss_curve[-1] if self.loss_curve else None,
            "final_reward": self.reward_curve[-1] if self.reward_curve else None,
            "rollouts": len(self.trajectory_ids),
            "judges": {k: score_summary(v) for k, v in self.judge_scores.items()},
            "seconds": round(self.seconds, 2),
            "node_seconds": self.node_seconds,
        }


def score_summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, mean, std, min, median, max of a score list."""
    vals = [float(v) for v in values]
    if not vals:
        return {"n": 0, "mean": None, "std": None, "min": None, "median": None, "max": None}
    return {"n": len(vals), "mean": statistics.fmean(vals), "std": statistics.pstdev(vals), "min": min(vals),
            "median": statistics.median(vals), "max": max(vals)}


def prompt_rows(logs: Sequence[EventLog], limit: int) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """GRPO prompt rows from logs that carry a task (deduplicated), and task -> metadata (the reference ``answer``).

    The source logs' system prompts are dropped: each policy's spec ``system_prompt`` governs its own turn.
    """
    rows, meta = [], {}
    for log in logs:
        task = log.metadata.get("task")
        if not isinstance(task, str) or not task or task in meta:
            continue
        rows.append({"prompt": [{"role": "user", "content": task}]})
        meta[task] = {"answer": str(log.metadata["answer"])} if log.metadata.get("answer") is not None else {}
        if len(rows) >= limit:
            break
    if not rows:
        raise ValueError("no trajectory carries a task (metadata['task']) to use as a multi-agent training prompt")
    return rows, meta


class ZeroVarianceRewards(RuntimeError):
    """Every reward in a GRPO step was equal: every advantage is zero and the update would teach nothing."""


def require_reward_variance(reward_fn: Callable[..., list[float]]) -> Callable[..., list[float]]:
    """The judge-panel reward, failing loudly on a step whose rewards are all equal (the adapter would stay at zero)."""

    def checked(*args: Any, **kwargs: Any) -> list[float]:
        rewards = list(reward_fn(*args, **kwargs))
        if len(rewards) > 1 and max(rewards) - min(rewards) <= 1e-12:
            raise ZeroVarianceRewards(
                f"every reward in this GRPO step is {rewards[0]} ({len(rewards)} completions): zero advantage, nothing to learn. "
                "Use judges that separate good from bad episodes (e.g. reward judges with answers, overlap with penalize_copy), "
                "more generations per prompt, or sampling temperature > 0"
            )
        return rewards

    checked.__name__ = getattr(reward_fn, "__name__", "judge_panel")
    return checked


def train_multi_agent(
    spec: GraphSpec,
    logs: Sequence[EventLog],
    output_dir: str | Path,
    base_model_path: str | Path | None = None,
    warehouse: Any = None,
    provenance: Any = None,
    run_id: str | None = None,
    base_model_name: str | None = None,
    log_fn: Callable[[str], None] | None = None,
    served: Any = None,
) -> MultiAgentResult:
    """Build the spec's graph and train its trainable policy with GRPO through ``create_agentic_trainer``.

    The compiled graph is the trainer's ``rollout_func`` and its judge panel the reward; every
    scored multi-agent EventLog goes to the warehouse (source ``multi_agent``) and the adapter's
    training rows name them.
    """
    import torch
    from datasets import Dataset

    from agenttune_lib.multi_agent.spec import build_graph, load_policy_model
    from agenttune_lib.rl.factory import create_agentic_trainer
    from agenttune_lib.rl.lineage import data_version, record_adapter, warehouse_sink

    say = log_fn or (lambda _m: None)
    t0 = time.perf_counter()
    t = spec.train
    torch.manual_seed(t.seed)
    rows, task_meta = prompt_rows(logs, t.max_prompts)
    policy_ref = spec.trainable.model
    model, tokenizer = load_policy_model(policy_ref, base_model_path, seed=t.seed)
    sink = warehouse_sink(warehouse, provenance, source="multi_agent") if warehouse is not None else None
    written: list[str] = []

    def record(batch: list[EventLog]) -> None:
        written.extend(log.id for log in batch)
        if sink is not None:
            sink(batch)

    graph = build_graph(spec, base_model_path=base_model_path, sink=record, task_metadata=task_meta, served=served)
    say(f"graph {spec.name!r}: plan {graph.plan}")
    adapter_id = f"multi-agent-{uuid.uuid4().hex[:10]}"
    adapter_dir = Path(output_dir) / "adapters" / adapter_id
    trainer = create_agentic_trainer(
        "grpo", model=model, tokenizer=tokenizer, train_dataset=Dataset.from_list(rows),
        reward_funcs=[require_reward_variance(graph.compile_grpo_reward())], rollout_func=graph.compile_rollout(),
        lora={"r": t.lora_r, "lora_alpha": 2 * t.lora_r}, output_dir=str(adapter_dir) + ".work",
        max_steps=t.max_steps, learning_rate=t.learning_rate, per_device_train_batch_size=t.batch_size,
        num_generations=t.num_generations, max_completion_length=t.max_completion_length, beta=0.0, seed=t.seed,
        # Rollouts generate with the trainer's own model: checkpointing would switch off its KV cache.
        gradient_checkpointing=False,
    )
    say(f"GRPO for {t.max_steps} step(s) on {len(rows)} prompts")
    trainer.train()
    history = trainer.state.log_history
    loss_curve = [float(h["loss"]) for h in history if "loss" in h]
    reward_curve = [float(h["reward"]) for h in history if "reward" in h]
    adapter_dir.mkdir(parents=True, exist_ok=True)
    trainer.model.save_pretrained(str(adapter_dir))
    tokenizer.save_pretrained(str(adapter_dir))
    node_seconds: dict[str, float] = {}
    for h in graph.history:
        for step, sec in h.get("seconds", {}).items():
            node_seconds[step] = round(node_seconds.get(step, 0.0) + sec, 3)
    base_name = base_model_name or (str(base_model_path) if policy_ref == "base" else policy_ref)
    result = MultiAgentResult(
        adapter_id=adapter_id, adapter_dir=adapter_dir, base_model=base_name, data_version="", trajectory_ids=list(written),
        judge_scores=graph.judge_distributions(), routes=[h["agent"] for h in graph.history], loss_curve=loss_curve,
        reward_curve=reward_curve, graph={**graph.describe(), "models": node_models(spec, served)}, seconds=time.perf_counter() - t0,
        node_seconds=node_seconds,
    )
    if warehouse is not None:
        result.data_version = record_adapter(warehouse, adapter_id, str(adapter_dir), base_name, "grpo", written, run_id=run_id, metrics=result.metrics())
    else:
        result.data_version = data_version(written)
    (adapter_dir / "agenttune_adapter.json").write_text(json.dumps(
        {"adapter_id": adapter_id, "base_model": base_name, "algorithm": "grpo", "multi_agent": result.graph,
         "spec": dataclasses.asdict(spec), "data_version": result.data_version, "metrics": result.metrics(), "run_id": run_id},
        indent=2, default=str))
    return result


def node_models(spec: GraphSpec, served: Any = None) -> dict[str, str]:
    """Which model each policy and model judge ran: its spec reference, ``deployed`` resolved to the adapter id it served."""
    def name(ref: str | None) -> str:
        return f"deployed:{served.served_adapter_id}" if ref == "deployed" and served is not None else str(ref)

    out = {p.name: name(p.model) for p in spec.policies}
    out.update({j.name: name(j.model) for j in spec.judges if j.kind == "llm"})
    return out


def attribution(warehouse: Any, trajectory_ids: Sequence[str] | None = None, run_id: str | None = None) -> dict[str, Any]:
    """Per-agent event counts and per-judge reward statistics, read back from the warehouse's ``events.author``."""
    clauses, params = ["t.source = 'multi_agent'"], []
    if trajectory_ids is not None:
        clauses.append("e.trajectory_id IN (SELECT unnest(?))")
        params.append(list(trajectory_ids))
    if run_id is not None:
        clauses.append("t.run_id = ?")
        params.append(run_id)
    cond = " AND ".join(clauses)
    agents = warehouse.execute(
        f"SELECT e.author, e.kind, count(*) FROM events e JOIN trajectories t ON t.id = e.trajectory_id "
        f"WHERE {cond} AND e.kind <> 'reward' AND e.author IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2", params)
    judges = warehouse.execute(
        f"SELECT e.author, count(*), avg(CAST(json_extract(e.payload, '$.value') AS DOUBLE)), "
        f"min(CAST(json_extract(e.payload, '$.value') AS DOUBLE)), max(CAST(json_extract(e.payload, '$.value') AS DOUBLE)) "
        f"FROM events e JOIN trajectories t ON t.id = e.trajectory_id WHERE {cond} AND e.kind = 'reward' AND e.author IS NOT NULL "
        f"GROUP BY 1 ORDER BY 1", params)
    per_agent: dict[str, dict[str, int]] = {}
    for author, kind, n in agents:
        per_agent.setdefault(author, {})[kind] = int(n)
    return {
        "agents": per_agent,
        "judges": {a: {"n": int(n), "mean": float(m), "min": float(lo), "max": float(hi)} for a, n, m, lo, hi in judges},
    }


def attribution_problems(logs: Sequence[EventLog]) -> list[dict[str, Any]]:
    """Where a multi-agent log cannot be attributed: an agent event with no author, a judge score with no authored REWARD,
    or a last episode REWARD that is not the panel's."""
    from agenttune_lib.events import AGENT_KINDS, EventKind
    from agenttune_lib.multi_agent.episode import PANEL_AUTHOR

    problems: list[dict[str, Any]] = []
    for log in logs:
        agents = set(log.metadata.get("agents") or [])
        for seq, ev in enumerate(log.events):
            if ev.kind in AGENT_KINDS and (ev.author is None or agents and ev.author not in agents):
                problems.append({"trajectory_id": log.id, "seq": seq, "problem": f"{ev.kind.value} event authored by {ev.author!r}, not one of the agents {sorted(agents)}"})
        rewards = log.filter(EventKind.REWARD)
        judged = {e.author: e.payload["value"] for e in rewards if e.payload.get("source") == "judge"}
        for judge, score in (log.metadata.get("judge_scores") or {}).items():
            if judge not in judged or float(judged[judge]) != float(score):
                problems.append({"trajectory_id": log.id, "problem": f"judge {judge!r} scored {score} but has no matching authored REWARD"})
        if not rewards or rewards[-1].author != PANEL_AUTHOR:
            problems.append({"trajectory_id": log.id, "problem": f"the last REWARD is not the {PANEL_AUTHOR}'s aggregate"})
    return problems
