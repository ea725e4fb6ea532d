"""train_adapter: one LoRA training run from warehouse trajectories to an adapter directory with lineage.

Used by the ``trained_adapter`` asset and ``agenttune train``. ``distill`` (SFT on filtered
teacher trajectories) or one of the five RL algorithms; every rollout it generates goes to
the warehouse as a full-tier EventLog, and the adapter's training rows are recorded there.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import math
import operator
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agenttune_lib.events import EventLog

__all__ = ["TrainConfig", "TrainResult", "train_adapter", "resolve_tools", "validate_names", "environment_task_rows", "calculator", "plot_curves", "ALGORITHMS"]

ALGORITHMS = ("distill", "grpo", "ppo", "dpo", "rloo", "bco")


@dataclasses.dataclass
class TrainConfig:
    """What to train, on what, for how long."""

    algorithm: str = "distill"
    max_steps: int = 4
    learning_rate: float = 2e-4
    batch_size: int = 4
    num_generations: int = 4
    max_completion_length: int = 32
    max_length: int = 384
    lora_r: int = 8
    lora_top_layers: int = 0
    rollout_actors: int = 0
    reward_funcs: tuple[str, ...] = ("format_reward",)
    tools: tuple[str, ...] = ()
    efficient: bool = False
    keep_rollouts: int | None = None
    max_trajectories: int = 16
    seed: int = 0
    # distillation (issue 12): learn only from episodes whose reward reaches success_threshold, refuse below
    # min_episodes survivors; loss is one of distill.LOSS_MODES; tool results clipped as in the student's prompt.
    success_threshold: float = 1.0
    min_episodes: int = 1
    loss: str = "weighted"
    max_tool_chars: int | None = None
    epochs: float | None = None
    #: Safety stop only: training that runs longer fails with a message naming this setting (None: no limit).
    #: The adapter is always bounded by ``max_steps`` / ``epochs``, never by the clock.
    max_wall_s: float | None = None
    #: distill.ROW_MODES: "turns" puts every assistant turn (the answer included) under the loss.
    rows_mode: str = "turns"
    #: Each kept no-tool demonstration (teacher ``expert_no_tool``) appears this many times in the distillation rows:
    #: a QA episode teaches three or four calls (weight 2 each) per answer, so at 1 the student calls on every prompt.
    no_tool_repeats: int = 1
    #: The no-tool kinds (``teachers.no_tool.NO_TOOL_KINDS``) ``no_tool_repeats`` applies to; empty: every kind. Kinds
    #: that offer corpus search or reuse QA train questions teach declining on QA prompts when repeated.
    no_tool_repeat_kinds: tuple[str, ...] = ()
    #: Distillation: the weight of each answer written after a tool result is multiplied by this (Table 3 gives the
    #: answer 1.0 against 2.0 per call, so a QA episode's three or four calls outweigh its one answer).
    answer_weight: float = 1.0
    # RL environments (issue 16): train on one environment's tasks (tau2_retail, qa_search, tool_call) of env_split;
    # qa_search searches the index at qa_index. Teacher logs of a τ² task run in tau2_retail even without this.
    environment: str | None = None
    env_split: str = "train"
    #: τ² tasks whose gold database equals the initial one pay 1.0 for doing nothing (11 of 114): left out of RL
    #: unless this is set; every τ² episode's metadata says ``gold_equals_initial`` either way.
    tau2_include_noop_tasks: bool = False
    qa_index: str | None = None
    #: DPO's TRL ``loss_type`` terms: ("sigmoid",) is plain DPO; adding "sft" is RPO (DPO plus the chosen side's NLL),
    #: which keeps the chosen answer's own likelihood rising instead of only widening the margin to the rejected one.
    dpo_loss: tuple[str, ...] = ("sigmoid",)
    #: Compute dtype: "float32", or "bfloat16" (mixed precision: bf16 autocast over fp32 weights, ~2.1× faster steps on a
    #: CPU with native bf16), or "auto" (bfloat16 where native). The adapter's weights are saved in fp32 either way.
    precision: str = "float32"

    def __post_init__(self) -> None:
        from agenttune_lib.models.precision import resolve_dtype

        if not isinstance(self.no_tool_repeats, int) or self.no_tool_repeats < 1:
            raise ValueError(f"TrainConfig.no_tool_repeats must be an integer >= 1, got {self.no_tool_repeats!r}")
        self.no_tool_repeat_kinds = tuple(self.no_tool_repeat_kinds)
        if not all(isinstance(k, str) and k for k in self.no_tool_repeat_kinds):
            raise ValueError(f"TrainConfig.no_tool_repeat_kinds must name no-tool kinds, got {self.no_tool_repeat_kinds!r}")
        if isinstance(self.answer_weight, bool) or not isinstance(self.answer_weight, (int, float)) \
                or not math.isfinite(self.answer_weight) or self.answer_weight <= 0:
            raise ValueError(f"TrainConfig.answer_weight must be a finite number > 0, got {self.answer_weight!r}")

        self.precision = resolve_dtype(self.precision, "TrainConfig.precision")
        self.algorithm = self.algorithm.lower()
        self.dpo_loss = tuple(self.dpo_loss)
        if not self.dpo_loss:
            raise ValueError("TrainConfig.dpo_loss names no loss term (e.g. ('sigmoid',) or ('sigmoid', 'sft'))")
        if self.dpo_loss != ("sigmoid",) and self.algorithm != "dpo":
            raise ValueError(f"TrainConfig.dpo_loss is a DPO setting; algorithm is {self.algorithm!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"TrainConfig.algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.max_steps < 1:
            raise ValueError(f"TrainConfig.max_steps must be >= 1, got {self.max_steps}")
        if self.rollout_actors and self.algorithm not in ("grpo", "ppo"):
            raise ValueError(f"TrainConfig.rollout_actors={self.rollout_actors} needs algorithm grpo or ppo (their sampling logprobs "
                             f"get the importance-sampling correction); {self.algorithm!r} trains on the trainer's own policy only")
        self.environment = self.environment or None
        if self.environment is not None:
            if self.environment not in ENVIRONMENT_NAMES:
                raise ValueError(f"TrainConfig.environment must be one of {ENVIRONMENT_NAMES}, got {self.environment!r}")
            if self.algorithm == "distill":
                raise ValueError("TrainConfig.environment is for RL algorithms; distill trains on teacher trajectories")
            if self.environment == "qa_search" and not self.qa_index:
                raise ValueError("TrainConfig.environment='qa_search' needs qa_index (the search index directory)")


ENVIRONMENT_NAMES = ("tau2_retail", "qa_search", "tool_call")


def _is_no_tool(log: EventLog) -> bool:
    """A no-tool demonstration: the scripted teacher's reply without a call (``teachers.no_tool``)."""
    return str(log.metadata.get("teacher", "")).startswith("expert_no_tool")


def no_tool_kind(log: EventLog) -> str | None:
    """A no-tool demonstration's kind (``unfit_near`` ...): its metadata, else its task id ``no_tool:<kind>:<i>``."""
    if not _is_no_tool(log):
        return None
    kind = log.metadata.get("no_tool_kind")
    if kind is None:
        parts = str(log.metadata.get("teacher_task_id", "")).split(":")
        kind = parts[1] if len(parts) == 3 and parts[0] == "no_tool" else None
    return None if kind is None else str(kind)


def repeat_no_tool(kept: list[EventLog], repeats: int, kinds: Sequence[str] = ()) -> list[EventLog]:
    """``kept`` followed by each no-tool demonstration (of ``kinds``, or all) ``repeats - 1`` more times."""
    chosen = [log for log in kept if _is_no_tool(log) and (not kinds or no_tool_kind(log) in kinds)]
    return kept + chosen * (repeats - 1)


def validate_names(config: TrainConfig) -> None:
    """Resolve the configured tools and rewards now, so a bad name fails before any model loads."""
    from agenttune_lib.rl.rewards.combine import resolve_reward

    if config.tools:
        resolve_tools(config.tools)
    for name in config.reward_funcs:
        try:
            resolve_reward(name)
        except KeyError as exc:
            raise ValueError(str(exc).strip('"')) from None


@dataclasses.dataclass
class TrainResult:
    """The adapter and what produced it."""

    adapter_id: str
    adapter_dir: Path
    algorithm: str
    base_model: str
    data_version: str
    trajectory_ids: list[str]
    loss_curve: list[float]
    reward_curve: list[float]
    rollouts_generated: int
    rollouts_used: int
    prompts_skipped: int
    seconds: float
    filter_counts: dict[str, int]
    #: Optimizer steps taken, tokens the loss saw (padding excluded), and how the rows were cut.
    steps: int = 0
    tokens_seen: int = 0
    row_stats: dict[str, int] = dataclasses.field(default_factory=dict)

    def metrics(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "tokens_seen": self.tokens_seen,
            "row_stats": self.row_stats,
            "loss_curve": [round(x, 6) for x in self.loss_curve],
            "final_loss": self.loss_curve[-1] if self.loss_curve else None,
            "first_loss": self.loss_curve[0] if self.loss_curve else None,
            "first_reward": self.reward_curve[0] if self.reward_curve else None,
            "final_reward": self.reward_curve[-1] if self.reward_curve else None,
            "rollouts_generated": self.rollouts_generated,
            "rollouts_used": self.rollouts_used,
            "prompts_skipped": self.prompts_skipped,
            "seconds": round(self.seconds, 2),
            "filter_counts": self.filter_counts,
        }


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Mod: operator.mod}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / % ** and parentheses).

    Args:
        expression: the arithmetic expression to evaluate, e.g. "12 * (3 + 4)"
    """

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(ev(node.right)) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression element {type(node).__name__}")

    value = ev(ast.parse(expression, mode="eval"))
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def resolve_tools(specs: Sequence[str]) -> list[Any]:
    """Tools from names: ``calculator``, or ``package.module:attr`` (a BaseTool, a tool class, or a callable)."""
    from agenttune_lib.tools.base import as_tool

    out = []
    for spec in specs:
        if spec == "calculator":
            out.append(as_tool(calculator))
            continue
        if ":" not in spec:
            raise ValueError(f"unknown tool {spec!r}: use 'calculator' or 'package.module:attr'")
        module_name, attr = spec.split(":", 1)
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import tool {spec!r}: {exc}") from exc
        out.append(as_tool(obj() if isinstance(obj, type) else obj))
    return out


def plot_curves(loss: Sequence[float], reward: Sequence[float], path: str | Path, title: str = "") -> Path:
    """A PNG with the loss curve and (when present) the mean-reward curve per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if reward else 1
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 3.2))
    axes = [axes] if panels == 1 else list(axes)
    axes[0].plot(range(1, len(loss) + 1), loss, marker="o")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("loss")
    axes[0].set_title("loss")
    if reward:
        axes[1].plot(range(1, len(reward) + 1), reward, marker="o", color="tab:green")
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("mean reward")
        axes[1].set_title("reward")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _prompt_rows(logs: Sequence[EventLog], include_noop_tasks: bool = False) -> list[dict[str, Any]]:
    """Training prompts from logs. A τ² task's log becomes a tau2_retail environment row (its tools run, its DB
    state scores; a task doing nothing passes is skipped unless ``include_noop_tasks``); a teacher's system prompt
    that lists tools is dropped (the rollout shows its own tools)."""
    import json as _json

    rows = []
    for log in logs:
        task = log.metadata.get("task")
        if not isinstance(task, str) or not task:
            continue
        if log.metadata.get("domain") == "tau2_retail" and log.metadata.get("task_id"):
            from agenttune_lib.rl.environments import Tau2Environment
            from agenttune_lib.spine.tau2 import gold_equals_initial

            env_task = {"task_id": str(log.metadata["task_id"])}
            if not include_noop_tasks and gold_equals_initial(env_task["task_id"]):
                continue
            rows.append({"prompt": Tau2Environment(include_noop_tasks=include_noop_tasks).reset(env_task), "environment": "tau2_retail",
                         "task": _json.dumps(env_task), "trajectory_id": log.id})
            continue
        system = log.metadata.get("system_prompt")
        if isinstance(system, str) and ("<tools>" in system or "<tool_call>" in system):
            system = None
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": task}]
        row: dict[str, Any] = {"prompt": msgs, "trajectory_id": log.id}
        if log.metadata.get("answer") is not None:
            row["answer"] = str(log.metadata["answer"])
        rows.append(row)
    if not rows:
        raise ValueError("no trajectory carries a task (metadata['task']) to use as a training prompt")
    return rows


def environment_task_rows(config: TrainConfig, warehouse: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(dataset rows, environment factories) for ``config.environment`` on ``config.env_split``."""
    from agenttune_lib.rl import environments as envs

    name = config.environment
    resources: dict[str, Any] = {}
    if name == "tau2_retail":
        noop = config.tau2_include_noop_tasks
        env, tasks = envs.Tau2Environment(include_noop_tasks=noop), envs.tau2_tasks(config.env_split, include_noop_tasks=noop)
        resources["include_noop_tasks"] = noop
    elif name == "tool_call":
        env, tasks = envs.ToolCallEnvironment(), envs.tool_call_tasks(config.env_split)
    elif name == "qa_search":
        if warehouse is None:
            raise ValueError("environment qa_search reads its QA split from the warehouse; pass warehouse=")
        from agenttune_lib.rag import load_backend

        resources["backend"] = load_backend(str(config.qa_index), kind="bm25")
        env, tasks = envs.QASearchEnvironment(resources["backend"]), envs.qa_search_tasks(warehouse, config.env_split)
    else:  # pragma: no cover - TrainConfig validates the name
        raise ValueError(f"unknown environment {name!r}")
    tasks = tasks[: config.max_trajectories]
    if not tasks:
        raise ValueError(f"environment {name!r} has no tasks in split {config.env_split!r}")
    rows = envs.environment_rows(env, tasks)
    for row, task in zip(rows, tasks):
        row["trajectory_id"] = f"{name}:{task.get('task_id', task.get('qa_id', ''))}"
    return rows, envs.environment_factories([name], **resources)


def _episode_messages(completion: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from agenttune_lib.rl.data import _episode_messages as em

    return em(completion)


def _teacher_vs_student_rows(algorithm: str, logs: Sequence[EventLog], engine: Any, tools: Any, sink: Any) -> list[dict[str, Any]]:
    """Corrective rows: the teacher's agent turns are preferred (DPO chosen / BCO desirable) over the student's rollout."""
    rows = [r for r in _prompt_rows(logs) if not r.get("environment")]
    by_id = {log.id: log for log in logs if log.tier == "full" and len(log.events)}
    rows = [r for r in rows if r["trajectory_id"] in by_id]
    if not rows:
        return []
    out = engine.rollout([r["prompt"] for r in rows], tools=tools)
    if sink is not None:
        sink(out["trajectories"])
    data: list[dict[str, Any]] = []
    for r, comp, student in zip(rows, out["completions"], out["trajectories"]):
        sft = by_id[r["trajectory_id"]].as_dataset_rows("sft")[0]["messages"]
        teacher = [{"role": m["role"], "content": str(m["content"])} for m in sft if m["role"] in ("assistant", "tool")]
        student_msgs = _episode_messages(comp)
        # Tool results stay in both episodes as context (TrlAgenticDPO/BCO keep them out of the loss).
        if not any(m["role"] == "assistant" for m in teacher) or teacher == student_msgs:
            continue
        if algorithm == "dpo":
            data.append({"prompt": r["prompt"], "chosen": teacher, "rejected": student_msgs, "chosen_trajectory_id": r["trajectory_id"]})
        else:
            data.append({"prompt": r["prompt"], "completion": teacher, "label": True, "trajectory_id": r["trajectory_id"]})
            data.append({"prompt": r["prompt"], "completion": student_msgs, "label": False, "trajectory_id": student.id})
    return data


def _with_log_environments(rows: Sequence[dict[str, Any]], environments: dict[str, Any] | None,
                           include_noop_tasks: bool = False) -> dict[str, Any] | None:
    """Add factories for environments that log-derived rows name (τ² teacher tasks) and the config did not."""
    named = {r["environment"] for r in rows if r.get("environment")}
    missing = named - set(environments or {})
    if not missing:
        return environments
    from agenttune_lib.rl.environments import environment_factories

    if "qa_search" in missing:
        raise ValueError("rows name the qa_search environment but no index was configured (TrainConfig.qa_index)")
    return {**(environments or {}), **environment_factories(sorted(missing), include_noop_tasks=include_noop_tasks)}


def _warm_start(model: Any, init_adapter: str | Path, config: TrainConfig) -> Any:
    """The base model with the PEFT adapter at ``init_adapter`` loaded trainable (a warm start)."""
    from peft import PeftModel

    path = Path(init_adapter)
    if not (path / "adapter_config.json").exists():
        raise FileNotFoundError(f"init_adapter={str(init_adapter)!r} is not a PEFT adapter directory (no adapter_config.json)")
    if config.algorithm not in ("dpo", "bco", "distill"):
        raise ValueError(f"train_adapter({config.algorithm}): a warm start (init_adapter) is supported for dpo, bco and distill")
    return PeftModel.from_pretrained(model, str(path), is_trainable=True)


def train_adapter(
    config: TrainConfig,
    base_model_path: str | Path,
    logs: Sequence[EventLog],
    output_dir: str | Path,
    warehouse: Any = None,
    provenance: Any = None,
    run_id: str | None = None,
    base_model_name: str | None = None,
    log_fn: Callable[[str], None] | None = None,
    offline_rows: Sequence[dict[str, Any]] | None = None,
    warehouse_snapshot: int | None = None,
    init_adapter: str | Path | None = None,
    parent_adapter_id: str | None = None,
) -> TrainResult:
    """Train a LoRA adapter on ``logs`` (teacher trajectories or their tasks) and save it under ``output_dir``.

    ``warehouse_snapshot``: the DuckLake snapshot ``logs`` were read at, recorded with the adapter.
    ``init_adapter``: warm start: continue training that PEFT adapter (e.g. the serving one, named by
    ``parent_adapter_id`` in the lineage) instead of a fresh LoRA; the result still applies to the same base.
    For DPO the reference is then the starting adapter (TRL keeps a frozen copy), not the bare base.
    """
    import torch
    from datasets import Dataset

    from agenttune_lib.models.base import load_base_model
    from agenttune_lib.rl import distill as distill_mod
    from agenttune_lib.rl.efficient import EfficiencyConfig
    from agenttune_lib.rl.factory import build_value_model, create_agentic_trainer
    from agenttune_lib.rl.lineage import record_adapter, warehouse_sink
    from agenttune_lib.rl.rollout import RolloutConfig, TransformersRolloutEngine

    say = log_fn or (lambda _m: None)
    t0 = time.perf_counter()
    torch.manual_seed(config.seed)
    logs = list(logs)
    if config.algorithm != "distill":  # distillation caps the episodes it keeps, after the success filter
        logs = logs[: config.max_trajectories]
    if not logs and offline_rows is None and config.environment is None:
        raise ValueError("train_adapter: no trajectories to train on")
    if offline_rows is not None and config.algorithm not in ("dpo", "bco"):
        # Only DPO and BCO consume offline rows here; anything else would silently train on teacher trajectories instead.
        raise ValueError(f"train_adapter({config.algorithm}): offline rows (a closed-loop retrain batch) are consumed by dpo and bco only; "
                         f"{config.algorithm} has no offline-rows path")
    model, tokenizer = load_base_model(base_model_path)
    if init_adapter is not None:
        model = _warm_start(model, init_adapter, config)
    adapter_id = f"{config.algorithm}-{uuid.uuid4().hex[:10]}"
    adapter_dir = Path(output_dir) / "adapters" / adapter_id
    sink = warehouse_sink(warehouse, provenance) if warehouse is not None else None
    common = {"max_steps": config.max_steps, "learning_rate": config.learning_rate, "seed": config.seed,
              "bf16": config.precision == "bfloat16"}
    lora: dict[str, Any] | None = {"r": config.lora_r, "lora_alpha": 2 * config.lora_r}
    n_layers = int(getattr(model.config, "num_hidden_layers", 0) or 0)
    if init_adapter is not None:
        lora = None  # the model already carries the adapter being trained
    elif config.lora_top_layers and n_layers:
        # LoRA on the top layers only: backpropagation stops at the lowest adapted layer (a large CPU saving).
        lora["layers_to_transform"] = list(range(max(n_layers - config.lora_top_layers, 0), n_layers))
        lora["target_modules"] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    tools = resolve_tools(config.tools) if config.tools else None
    env_rows: list[dict[str, Any]] | None = None
    environments: dict[str, Any] | None = None
    if config.environment is not None:
        env_rows, environments = environment_task_rows(config, warehouse)
        say(f"{len(env_rows)} {config.environment} tasks ({config.env_split})")
    filter_counts: dict[str, int] = {}
    trainer_ids: list[str]
    if config.algorithm == "dpo":
        common = {**common, "loss_type": list(config.dpo_loss)}
    if config.algorithm == "distill":
        logs = [distill_mod.as_full_tier(log, tokenizer) for log in logs]
        report = distill_mod.filter_teacher_trajectories(logs, success_threshold=config.success_threshold)
        report.dropped.update({log.id: "over_max_trajectories" for log in report.kept[config.max_trajectories:]})
        report.kept = report.kept[: config.max_trajectories]
        report.kept = repeat_no_tool(report.kept, config.no_tool_repeats, config.no_tool_repeat_kinds)
        filter_counts = report.counts
        distill_mod.require_min_episodes(report, config.min_episodes)
        say(f"distilling {len(report.kept)} of {len(logs)} teacher trajectories ({report.counts})")
        if config.epochs is not None:  # a whole number of passes instead of a step count
            common = {**common, "max_steps": -1, "num_train_epochs": config.epochs}
        trainer = distill_mod.distill(
            model, tokenizer, report.kept, lora=lora, max_length=config.max_length,
            output_dir=str(adapter_dir) + ".work", per_device_train_batch_size=config.batch_size,
            loss=config.loss, success_threshold=config.success_threshold, min_episodes=config.min_episodes,
            max_tool_chars=config.max_tool_chars, max_wall_s=config.max_wall_s, rows_mode=config.rows_mode,
            answer_weight=float(config.answer_weight), **common,
        )
        trainer_ids = [log.id for log in report.kept]
        rs = getattr(trainer, "agenttune_row_stats", {}) or {}
        if rs.get("answer_turns_dropped"):
            say(f"{rs['answer_turns_dropped']} of {rs['answer_turns']} answer turns do not fit max_length={config.max_length} "
                "even with tool results compacted to the passage they use, so they teach nothing; raise distill.max_length to train them")
    elif config.algorithm in ("dpo", "bco") and offline_rows is not None:
        data = list(offline_rows)
        if not data:
            raise ValueError(f"train_adapter({config.algorithm}): offline_rows is empty")
        keys = {"dpo": ("prompt", "chosen", "rejected"), "bco": ("prompt", "completion", "label")}[config.algorithm]
        missing = [k for k in keys if k not in data[0]]
        if missing:
            raise ValueError(f"train_adapter({config.algorithm}): offline rows lack {missing}; got columns {sorted(data[0])}")
        say(f"{config.algorithm} on {len(data)} offline rows")
        trainer = create_agentic_trainer(
            config.algorithm, model=model, tokenizer=tokenizer, lora=lora, output_dir=str(adapter_dir) + ".work",
            train_dataset=Dataset.from_list([{k: r[k] for k in keys} for r in data]),
            per_device_train_batch_size=min(config.batch_size, len(data)), max_length=config.max_length, **common,
        )
        trainer_ids = [str(r.get("trajectory_id") or r.get("chosen_trajectory_id") or f"offline-{i}") for i, r in enumerate(data)]
    elif config.algorithm in ("dpo", "bco"):
        from agenttune_lib.rl.data import bco_rows_from_rollouts, preference_pairs_from_rollouts

        rows = env_rows if env_rows is not None else _prompt_rows(logs, config.tau2_include_noop_tasks)
        environments = _with_log_environments(rows, environments, config.tau2_include_noop_tasks)
        engine = TransformersRolloutEngine(model, tokenizer, RolloutConfig(max_new_tokens=config.max_completion_length))
        prompts = [r["prompt"] for r in rows]
        derive = preference_pairs_from_rollouts if config.algorithm == "dpo" else bco_rows_from_rollouts
        data = derive(engine, prompts, list(config.reward_funcs), n=config.num_generations, tools=tools, sink=sink, rows=rows, environments=environments)
        if config.algorithm == "dpo" and not data or config.algorithm == "bco" and len({r["label"] for r in data}) < 2:
            # No reward margin among the student's own rollouts: pair teacher behaviour against them instead.
            data = _teacher_vs_student_rows(config.algorithm, logs, engine, tools, sink)
            say(f"{config.algorithm}: rollouts had no reward margin; using {len(data)} teacher-vs-student rows")
        if not data:
            raise ValueError(
                f"train_adapter({config.algorithm}): the {config.num_generations} rollouts per prompt all scored alike under "
                f"{list(config.reward_funcs)} (no reward margin to rank) and there are no teacher trajectories to pair against; "
                "use a reward that separates the policy's rollouts, more generations, or teacher trajectories"
            )
        keys = {"dpo": ("prompt", "chosen", "rejected"), "bco": ("prompt", "completion", "label")}[config.algorithm]
        trainer = create_agentic_trainer(
            config.algorithm, model=model, tokenizer=tokenizer, lora=lora, output_dir=str(adapter_dir) + ".work",
            train_dataset=Dataset.from_list([{k: r[k] for k in keys} for r in data]),
            per_device_train_batch_size=min(config.batch_size, len(data)), max_length=config.max_length, **common,
        )
        trainer_ids = [r.get("chosen_trajectory_id", r.get("trajectory_id")) for r in data]
    else:
        rows = env_rows if env_rows is not None else _prompt_rows(logs, config.tau2_include_noop_tasks)
        environments = _with_log_environments(rows, environments, config.tau2_include_noop_tasks)
        dataset = Dataset.from_list([{k: v for k, v in r.items() if k != "trajectory_id"} for r in rows])
        kwargs: dict[str, Any] = dict(
            num_generations=config.num_generations, max_completion_length=config.max_completion_length,
            per_device_train_batch_size=config.batch_size, beta=0.0, **common,
        )
        if config.algorithm in ("grpo", "ppo") and (config.efficient or config.keep_rollouts):
            kwargs["efficiency"] = EfficiencyConfig(pre_rollout_filter=config.efficient, keep_rollouts=config.keep_rollouts)
        if config.algorithm == "ppo":
            kwargs["value_model"] = build_value_model(model)
        engine = None
        if config.rollout_actors > 0:
            from agenttune_lib.rl.ray_engine import RayRolloutEngine

            # Each actor holds a policy copy; the trainer pushes its LoRA weights before every generation step.
            engine = RayRolloutEngine(str(base_model_path), num_actors=config.rollout_actors, lora=lora, cpus_per_actor=0.5,
                                      config=RolloutConfig(max_new_tokens=config.max_completion_length))
        if tools is None and sink is not None:
            tools = []  # the agentic loop also records plain completions as EventLogs
        trainer = create_agentic_trainer(
            config.algorithm, model=model, tokenizer=tokenizer, lora=lora, output_dir=str(adapter_dir) + ".work",
            train_dataset=dataset, reward_funcs=list(config.reward_funcs), tools=tools, rollout_engine=engine,
            rollout_sink=sink, environments=environments, **kwargs,
        )
        trainer_ids = []
    say(f"training {config.algorithm} for {config.max_steps} steps")
    try:
        trainer.train()
    finally:
        rollout_engine = getattr(getattr(trainer, "agenttune_rollout_func", None), "engine", None)
        if hasattr(rollout_engine, "shutdown"):
            rollout_engine.shutdown()
    history = trainer.state.log_history
    steps = int(trainer.state.global_step)
    row_stats = dict(getattr(trainer, "agenttune_row_stats", {}) or {})
    tokens_seen = int(getattr(trainer.state, "num_input_tokens_seen", 0) or 0)
    loss_curve = [float(h["loss"]) for h in history if "loss" in h and math.isfinite(float(h["loss"]))]
    reward_curve = [float(h["reward"]) for h in history if "reward" in h]
    generated = used = skipped = 0
    eff_log = getattr(trainer, "efficiency_log", None)
    if eff_log:
        generated = sum(s.rollouts_generated for s in eff_log)
        used = sum(s.rollouts_used for s in eff_log)
        skipped = sum(s.prompts_skipped for s in eff_log)
    if sink is not None and not trainer_ids:
        trainer_ids = list(sink.written)
    if not generated and sink is not None:
        generated = used = len(sink.written)
    adapter_dir.mkdir(parents=True, exist_ok=True)
    trainer.model.save_pretrained(str(adapter_dir))
    tokenizer.save_pretrained(str(adapter_dir))
    result = TrainResult(
        adapter_id=adapter_id, adapter_dir=adapter_dir, algorithm=config.algorithm,
        base_model=base_model_name or str(base_model_path), data_version="", trajectory_ids=trainer_ids,
        loss_curve=loss_curve, reward_curve=reward_curve, rollouts_generated=generated, rollouts_used=used,
        prompts_skipped=skipped, seconds=time.perf_counter() - t0, filter_counts=filter_counts,
        steps=steps, tokens_seen=tokens_seen, row_stats=row_stats,
    )
    if warehouse is not None:
        result.data_version = record_adapter(
            warehouse, adapter_id, str(adapter_dir), result.base_model, config.algorithm, trainer_ids, run_id=run_id, metrics=result.metrics(),
            warehouse_snapshot=warehouse_snapshot, parent_adapter_id=parent_adapter_id,
        )
    else:
        from agenttune_lib.rl.lineage import data_version

        result.data_version = data_version(trainer_ids)
    (adapter_dir / "agenttune_adapter.json").write_text(
        json.dumps({"adapter_id": adapter_id, "base_model": result.base_model, "base_model_path": str(base_model_path), "algorithm": config.algorithm,
                    "data_version": result.data_version, "config": dataclasses.asdict(config), "metrics": result.metrics(), "run_id": run_id,
                    "parent_adapter_id": parent_adapter_id, "init_adapter": str(init_adapter) if init_adapter is not None else None}, indent=2, default=str)
    )
    return result
