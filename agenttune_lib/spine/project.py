"""The Project lifecycle: infer, collect, collect_rollout, evaluate, evaluate_agentic, train, distill, heal.

Every call emits a LifecycleEvent; every trajectory it produces lands in the warehouse (when
one is attached) with a Provenance. Training runs through a caller-supplied trainer_factory,
so a Project never builds a trainer or imports the training stack itself.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agenttune_lib.events import EventKind, EventLog
from agenttune_lib.spine.episode import episode_succeeded, run_episode, run_reflexion
from agenttune_lib.spine.harness import DictToolHarness, Harness
from agenttune_lib.spine.record import rejected_logs
from agenttune_lib.spine.state import Generation
from agenttune_lib.spine.strategies import AgentStrategy, ReActStrategy, ReflexionStrategy

__all__ = ["Project", "LifecycleEvent", "engine_model", "default_distill_filter", "REJECTED_SOURCE"]

#: Warehouse source of rejected branches (tree-of-thoughts dead ends, Reflexion failed attempts).
REJECTED_SOURCE = "spine_rejected"


@dataclasses.dataclass(frozen=True)
class LifecycleEvent:
    """One lifecycle call: which stage, when, on which trajectories, with what outcome."""

    stage: str
    at: float
    trajectory_ids: tuple[str, ...] = ()
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


def _coerce_generation(out: Any) -> str | Generation:
    if isinstance(out, (str, Generation)):
        return out
    if isinstance(out, dict):
        text = out.get("text", out.get("completion", out.get("response")))
        if not isinstance(text, str):
            raise TypeError(f"engine output dict has no text/completion/response string: keys {sorted(out)}")
        if out.get("completion_ids") is not None:
            return Generation(text, out.get("prompt_ids"), list(out["completion_ids"]), out.get("logprobs"))
        return text
    text = getattr(out, "text", None)
    if isinstance(text, str):
        return Generation(text, getattr(out, "prompt_ids", None), getattr(out, "completion_ids", None), getattr(out, "logprobs", None))
    raise TypeError(f"engine returned {type(out).__name__}; expected str, Generation or a dict with 'text'")


def engine_model(engine: Any) -> Callable[[Any], str | Generation]:
    """The model callable of a rollout engine.

    The engine protocol, first match wins: ``engine.generate(messages)`` returning text, a
    Generation or a ``{"text", "prompt_ids", "completion_ids", "logprobs"}`` dict;
    ``engine.rollout([messages])`` returning a one-item list of those; or the engine itself
    as a callable.
    """
    if hasattr(engine, "generate") and callable(engine.generate) and not _is_hf_model(engine):
        return lambda messages: _coerce_generation(engine.generate(messages))
    if hasattr(engine, "rollout") and callable(engine.rollout):
        def via_rollout(messages: Any) -> str | Generation:
            outs = engine.rollout([messages])
            if not outs:
                raise ValueError("engine.rollout returned no output for one prompt")
            return _coerce_generation(outs[0])

        return via_rollout
    if callable(engine):
        return lambda messages: _coerce_generation(engine(messages))
    raise TypeError(f"{type(engine).__name__} is not an engine: needs generate(messages), rollout(prompts) or __call__")


def _is_hf_model(obj: Any) -> bool:
    return type(obj).__module__.startswith("transformers.")


def default_distill_filter(log: EventLog, threshold: float = 1.0) -> bool:
    """Keep a teacher trajectory for distillation: no tool or schema errors, and a successful outcome."""
    if any(e.is_error for e in log):
        return False
    if any(e.kind is EventKind.TEXT and e.payload.get("malformed_tool_call") for e in log):
        return False
    return episode_succeeded(log, threshold)


class Project:
    """A strategy plus a harness, with the lifecycle around them and an optional warehouse for every log."""

    def __init__(
        self,
        strategy: AgentStrategy | None = None,
        harness: Harness | None = None,
        warehouse: Any = None,
        name: str = "project",
        run_id: str | None = None,
        asset_key: str | None = None,
        model_version: str | None = None,
        listeners: Sequence[Callable[[LifecycleEvent], None]] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.strategy = strategy
        self.harness = harness
        self.warehouse = warehouse
        self.name = name
        self.run_id = run_id or f"project-{uuid.uuid4().hex[:12]}"
        self.asset_key = asset_key
        self.model_version = model_version
        self.listeners = list(listeners)
        self.clock = clock
        self.trajectories: list[EventLog] = []
        self.events: list[LifecycleEvent] = []

    # -- bookkeeping -----------------------------------------------------------------
    def _emit(self, stage: str, logs: Iterable[EventLog] = (), **details: Any) -> LifecycleEvent:
        event = LifecycleEvent(stage, self.clock(), tuple(log.id for log in logs), details)
        self.events.append(event)
        for listener in self.listeners:
            listener(event)
        return event

    def _provenance(self, stage: str, extra: dict[str, Any] | None = None) -> Any:
        from agenttune_lib.warehouse import Provenance

        return Provenance(
            run_id=self.run_id,
            asset_key=self.asset_key,
            model_version=self.model_version,
            extra={"project": self.name, "stage": stage, **(extra or {})},
        )

    def _keep(self, logs: list[EventLog], stage: str, extra: dict[str, Any] | None = None) -> list[EventLog]:
        for log in logs:
            log.metadata.setdefault("project", self.name)
            log.metadata.setdefault("lifecycle_stage", stage)
        self.trajectories.extend(logs)
        if self.warehouse is not None and logs:
            self.warehouse.append_logs(logs, provenance=self._provenance(stage, extra), source="spine")
            # Rejected branches are trajectories of their own (metadata branch_of = the episode), kept
            # under a separate source so nothing reads them as accepted data by accident.
            branches = [branch for log in logs for branch in rejected_logs(log)]
            if branches:
                self.warehouse.append_logs(branches, provenance=self._provenance(stage, extra), source=REJECTED_SOURCE)
        return logs

    def _require(self) -> tuple[AgentStrategy, Harness]:
        if self.strategy is None or self.harness is None:
            raise ValueError(f"Project {self.name!r} needs a strategy and a harness for this call")
        return self.strategy, self.harness

    def _run(self, strategy: AgentStrategy, harness: Harness, task: Any) -> EventLog:
        if isinstance(strategy, ReflexionStrategy):
            return run_reflexion(strategy, harness, task)
        return run_episode(strategy, harness, task)

    # -- the lifecycle ---------------------------------------------------------------
    def add_trajectory(self, log: EventLog) -> EventLog:
        """Add a hand-built (e.g. demonstration) trajectory."""
        if not isinstance(log, EventLog):
            raise TypeError(f"add_trajectory needs an EventLog, got {type(log).__name__}")
        self._keep([log], "add_trajectory")
        self._emit("add_trajectory", [log])
        return log

    def infer(self, task: Any) -> EventLog:
        """Run one episode on ``task``."""
        strategy, harness = self._require()
        log = self._keep([self._run(strategy, harness, task)], "infer")[0]
        self._emit("infer", [log], reward=log.rewards("episode"))
        return log

    def collect(self, tasks: Iterable[Any], episodes_per_task: int = 1) -> list[EventLog]:
        """Run the project's strategy over ``tasks`` and keep every log."""
        strategy, harness = self._require()
        logs = [self._run(strategy, harness, task) for task in tasks for _ in range(episodes_per_task)]
        self._keep(logs, "collect")
        self._emit("collect", logs, n=len(logs), success_rate=_success_rate(logs))
        return logs

    def collect_rollout(
        self,
        engine: Any,
        tasks: Iterable[Any],
        tools: Any = None,
        max_steps: int = 8,
        strategy_factory: Callable[[Callable[[Any], Any]], AgentStrategy] | None = None,
        reward_fn: Callable[[str, Any], float | None] | None = None,
    ) -> list[EventLog]:
        """Roll out a real engine: text-only without ``tools``; agentic (ReAct over the tools) with them.

        ``tools`` is a Harness, or anything ``DictToolHarness`` accepts (a name→callable
        mapping or a list of tool-likes). Engines that report token ids give full-tier logs.
        """
        model = engine_model(engine)
        factory = strategy_factory or (lambda m: ReActStrategy(m, max_steps=max_steps))
        strategy = factory(model)
        if tools is None:
            harness: Harness = DictToolHarness({}, reward_fn=reward_fn, max_steps=1)
        elif isinstance(tools, Harness):
            harness = tools
        else:
            harness = DictToolHarness(tools, reward_fn=reward_fn, max_steps=max_steps)
        logs = [self._run(strategy, harness, task) for task in tasks]
        for log in logs:
            log.metadata["engine"] = type(engine).__name__
            log.metadata["agentic"] = tools is not None
        self._keep(logs, "collect_rollout", {"engine": type(engine).__name__, "agentic": tools is not None})
        self._emit(
            "collect_rollout",
            logs,
            n=len(logs),
            agentic=tools is not None,
            tiers=sorted({log.tier for log in logs}),
            tool_calls=sum(len(log.filter(EventKind.TOOL_CALL)) for log in logs),
            success_rate=_success_rate(logs),
        )
        return logs

    def evaluate(self, tasks: Iterable[Any], threshold: float = 1.0) -> dict[str, Any]:
        """Task success over ``tasks`` (episode reward ≥ threshold) and the mean episode reward."""
        strategy, harness = self._require()
        logs = [self._run(strategy, harness, task) for task in tasks]
        self._keep(logs, "evaluate")
        rewards = [log.rewards("episode")[-1] for log in logs if log.rewards("episode")]
        report = {
            "n": len(logs),
            "success_rate": _success_rate(logs, threshold),
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "trajectory_ids": [log.id for log in logs],
        }
        self._emit("evaluate", logs, **{k: v for k, v in report.items() if k != "trajectory_ids"})
        return report

    def evaluate_agentic(self, logs: Sequence[EventLog] | None = None, goldens: Any = None, evaluator: Any = None) -> dict[str, Any]:
        """Deterministic trajectory metrics (paper Table 7) over ``logs`` (default: every kept trajectory)."""
        logs = list(self.trajectories if logs is None else logs)
        if evaluator is None:
            from agenttune_lib.evaluation.trajectory import TrajectoryEvaluator

            evaluator = TrajectoryEvaluator(self.harness.action_space() if self.harness is not None else None)
        report = evaluator.evaluate_batch(logs, goldens)
        report["success_rate"] = _success_rate(logs)
        self._emit("evaluate_agentic", logs, mean=report.get("mean"), success_rate=report["success_rate"])
        return report

    def _training_rows(self, logs: Sequence[EventLog], fmt: str, tokenizer: Any) -> list[dict[str, Any]]:
        full = [log for log in logs if log.tier == "full"]
        if not full:
            raise ValueError(
                f"no full-tier trajectories among {len(logs)} logs; collect through a token-reporting engine "
                "or add EventLog(tier='full') demonstrations"
            )
        if tokenizer is not None:
            from agenttune_lib.models.chat_tokens import token_rows

            return [row for log in full for row in token_rows(log, tokenizer)]
        return [row for log in full for row in log.as_dataset_rows(fmt)]

    def _fit(self, stage: str, trainer_factory: Callable[..., Any], rows: list[dict[str, Any]], model: Any, logs: Sequence[EventLog]) -> Any:
        if not callable(trainer_factory):
            raise TypeError(f"{stage} needs a callable trainer_factory(rows, model) -> trainer with .train()")
        trainer = trainer_factory(rows, model)
        result = trainer.train() if hasattr(trainer, "train") else trainer
        self._emit(stage, logs, rows=len(rows), trainer=type(trainer).__name__)
        return result

    def _training_pool(self, include_stages: Sequence[str]) -> list[EventLog]:
        """The kept trajectories minus held-out evaluation logs (``evaluate``), unless that stage is named in ``include_stages``."""
        return [log for log in self.trajectories if log.metadata.get("lifecycle_stage") != "evaluate" or "evaluate" in include_stages]

    def train(
        self,
        fmt: str = "sft",
        trainer_factory: Callable[..., Any] | None = None,
        logs: Sequence[EventLog] | None = None,
        model: Any = None,
        tokenizer: Any = None,
        success_threshold: float | None = 1.0,
        include_stages: Sequence[str] = (),
    ) -> Any:
        """Supervised fine-tuning on the kept full-tier trajectories via ``trainer_factory(rows, model)``.

        Rows are ``as_dataset_rows(fmt)`` output, or ``models.chat_tokens.token_rows(log, tokenizer)`` when a tokenizer is given.
        Episodes whose reward is below ``success_threshold`` are dropped; ``evaluate()`` logs are
        held out unless ``include_stages=("evaluate",)`` asks for them by name.
        """
        if trainer_factory is None:
            raise ValueError("Project.train needs trainer_factory=(rows, model) -> trainer; the Project never builds one")
        logs = list(self._training_pool(include_stages) if logs is None else logs)
        if success_threshold is not None:
            logs = [log for log in logs if not log.rewards("episode") or log.rewards("episode")[-1] >= success_threshold]
            if not logs:
                raise ValueError(f"Project.train: no trajectory reaches the success threshold {success_threshold}")
        rows = self._training_rows(logs, fmt, tokenizer)
        return self._fit("train", trainer_factory, rows, model, logs)

    def distill(
        self,
        student: Any,
        trainer_factory: Callable[..., Any] | None = None,
        teacher_logs: Sequence[EventLog] | None = None,
        keep: Callable[[EventLog], bool] = default_distill_filter,
        tokenizer: Any = None,
        include_stages: Sequence[str] = (),
    ) -> Any:
        """Agentic behavior cloning: filter the teacher's trajectories, then SFT the student on the survivors.

        ``evaluate()`` logs are held out unless ``include_stages=("evaluate",)`` asks for them by name.
        """
        if trainer_factory is None:
            raise ValueError("Project.distill needs trainer_factory=(rows, student) -> trainer")
        logs = list(self._training_pool(include_stages) if teacher_logs is None else teacher_logs)
        kept = [log for log in logs if keep(log)]
        if not kept:
            raise ValueError(f"distill: none of {len(logs)} teacher trajectories passed the filter")
        rows = self._training_rows(kept, "sft", tokenizer)
        result = self._fit("distill", trainer_factory, rows, student, kept)
        self.events[-1].details.update(filtered_out=len(logs) - len(kept))
        return result

    def heal(self, detector: Any = None, logs: Sequence[EventLog] | None = None, loop: Any = None) -> dict[str, Any]:
        """Audit records of the kept trajectories, handed to a failure detector (and a ClosedLoop's buffer when given)."""
        logs = list(self.trajectories if logs is None else logs)
        records = {log.id: log.to_audit_records() for log in logs}
        if detector is None and loop is None:
            from agenttune_lib.closed_loop import FailureDetector

            detector = FailureDetector()
        failures: list[Any] = []
        if detector is not None:
            if hasattr(detector, "detect_logs"):
                failures = list(detector.detect_logs(logs))
            elif callable(detector):
                failures = list(detector(records))
            else:
                raise TypeError(f"detector {type(detector).__name__} has neither detect_logs(logs) nor __call__(records)")
        ingest = loop.ingest_logs(logs) if loop is not None else None
        report = {
            "n_logs": len(logs),
            "n_records": sum(len(r) for r in records.values()),
            "error_records": sum(1 for recs in records.values() for r in recs if r.get("status") == "error"),
            "failures": failures,
            "ingest": ingest,
        }
        self._emit("heal", logs, n_failures=len(failures), error_records=report["error_records"])
        return report


def _success_rate(logs: Sequence[EventLog], threshold: float = 1.0) -> float | None:
    if not logs:
        return None
    return sum(1 for log in logs if episode_succeeded(log, threshold)) / len(logs)
