"""GraphRunner: compiles a TemplateConfig into a LangGraph StateGraph (one node per stage) and runs it."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from agenttune_lib.decide.audit import AuditWriter, Redactor, utc_now
from agenttune_lib.decide.config import TemplateConfig, expected_labels
from agenttune_lib.decide.errors import DecideError, StageError
from agenttune_lib.decide.models import as_model
from agenttune_lib.decide.registry import TemplateRegistry
from agenttune_lib.decide.stages import Stage, StageContext, StageResult, make_stage
from agenttune_lib.decide.state import PipelineState

try:
    from langgraph.errors import GraphBubbleUp
except ImportError:  # pragma: no cover - langgraph always ships it
    GraphBubbleUp = ()  # type: ignore[assignment,misc]

__all__ = ["GraphRunner"]


class _GraphState(TypedDict):
    ps: PipelineState


def _default_review_dir() -> Path:
    from agenttune_lib.config import PlatformPaths

    return PlatformPaths.from_env().artifacts / "decide" / "reviews"


class GraphRunner:
    """Runs one template. Models, tools, the audit log and the review folder are injected.

    Runs are independent: one runner may serve several threads at once (each run gets
    its own stage context and redaction hook).

    ``model`` is the default backend (``models`` maps further names a stage's ``model:``
    may use); ``tools`` is anything ``agenttune_lib.tools.as_tools`` accepts;
    ``audit`` an AuditWriter or a path. ``destinations`` overrides the output stages'
    destination specs (``[]`` disables dispatch).
    """

    def __init__(
        self,
        config: TemplateConfig,
        model: Any = None,
        models: Mapping[str, Any] | None = None,
        tools: Any = None,
        audit: AuditWriter | str | Path | None = None,
        review_dir: str | Path | None = None,
        human_review_timeout: float | None = None,
        destinations: Sequence[Mapping[str, Any]] | None = None,
        destination_base: str | Path | None = None,
        warehouse_path: str | Path | None = None,
        max_new_tokens: int | None = None,
        max_retries: int | None = None,
        max_steps: int | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        served_adapter_id: str | None = None,
        checkpointer: Any = "default",
    ) -> None:
        from agenttune_lib.decide.domain_tools import default_tools
        from agenttune_lib.tools import as_tools

        self.config = config
        all_models = {name: as_model(m) for name, m in (models or {}).items()}
        if model is not None:
            all_models["default"] = as_model(model)
        self.models = all_models
        # Which deployed adapter made each decision (closed-loop lineage): given, else the default backend's.
        self.served_adapter_id = served_adapter_id or getattr(all_models.get("default"), "served_adapter_id", None)
        self.tools = {**default_tools(), **as_tools(tools)}
        # A path gets a keyed writer whose head checkpoint lives in the warehouse when one is given.
        self.audit = audit if isinstance(audit, AuditWriter) or audit is None else AuditWriter(audit, warehouse=warehouse_path)
        self.max_steps = int(max_steps) if max_steps is not None else config.max_steps
        self.destination_specs = list(destinations) if destinations is not None else config.destinations
        self.destination_base = Path(destination_base) if destination_base is not None else _default_review_dir().parent
        self.warehouse_path = warehouse_path
        review_root = Path(review_dir) if review_dir is not None else _default_review_dir()
        # Where parked runs wait: a LangGraph checkpointer (SQLite next to the reviews by default; a PostgreSQL URL in
        # production); ``None`` disables parking (a review then fails closed at once).
        self._checkpointer_spec = review_root / "checkpoints.sqlite" if checkpointer == "default" else checkpointer
        self._checkpointer: Any = None
        self.context = StageContext(
            config=config,
            models=self.models,
            tools=self.tools,
            review_dir=Path(review_dir) if review_dir is not None else _default_review_dir(),
            human_review_timeout=human_review_timeout,
            suspend=self._checkpointer_spec is not None,
            max_new_tokens=max_new_tokens,
            max_retries=max_retries,
            clock=clock,
            sleep=sleep,
        )
        self.stages: dict[str, Stage] = {s["id"]: make_stage(s, config) for s in config.stages}
        self._checked = False
        self._graph: Any = None
        self._runs: dict[str, tuple[StageContext, Redactor]] = {}
        self._expected: dict[str, tuple[str, ...]] = {}  # run id -> the verdict labels its input row expects
        self._runs_lock = threading.Lock()
        # Threads sharing the runner build the graph and open the checkpointer once (two SQLite opens race for its lock).
        self._init_lock = threading.RLock()

    @classmethod
    def from_template(
        cls, template_id: str, registry: TemplateRegistry | None = None, templates_dir: str | Path | None = None, **kwargs: Any
    ) -> "GraphRunner":
        """Load ``template_id`` from the registry (the bundled templates by default) and build a runner."""
        registry = registry or TemplateRegistry(templates_dir)
        return cls(registry.get(template_id), **kwargs)

    def check(self) -> None:
        """Every model and tool the stages name is present; compiling needs neither, running needs both."""
        for stage in self.stages.values():
            stage.check(self.context)
        self._checked = True

    # -- graph -------------------------------------------------------------------
    def compile(self) -> Any:
        """The compiled LangGraph StateGraph: one node per stage, conditional edges from the edge list."""
        if self._graph is not None:
            return self._graph
        with self._init_lock:
            if self._graph is None:
                self._graph = self._build_graph()
        return self._graph

    def _build_graph(self) -> Any:
        from langgraph.graph import END, START, StateGraph

        graph = StateGraph(_GraphState)
        for sid, stage in self.stages.items():
            graph.add_node(sid, self._node(stage))
        graph.add_edge(START, self.config.entry)
        for sid in self.stages:
            targets = self.config.targets(sid)
            path_map = {t: t for t in targets}
            path_map[END] = END
            graph.add_conditional_edges(sid, self._route, path_map)
        return graph.compile(checkpointer=self.checkpointer)

    @property
    def checkpointer(self) -> Any:
        """The LangGraph checkpointer parked runs live in (created on first use), or None."""
        if self._checkpointer is None and self._checkpointer_spec is not None:
            from agenttune_lib.decide.checkpoint import make_checkpointer

            with self._init_lock:
                if self._checkpointer is None:
                    self._checkpointer = make_checkpointer(self._checkpointer_spec)
        return self._checkpointer

    @property
    def graph(self) -> Any:
        """The compiled LangGraph graph (compiled on first use)."""
        return self.compile()

    @staticmethod
    def _route(gs: _GraphState) -> str:
        from langgraph.graph import END

        ps = gs["ps"]
        return END if ps.completed or not ps.next_stage else ps.next_stage

    def _default_next(self, stage: Stage, result: StageResult) -> str | None:
        if result.next:
            return result.next
        return stage.spec.get("next")

    def _node(self, stage: Stage) -> Callable[[_GraphState], dict[str, Any]]:
        def run_stage(gs: _GraphState) -> dict[str, Any]:
            ps = gs["ps"]
            self._execute(stage, ps)
            return {"ps": ps}

        run_stage.__name__ = f"stage_{stage.id}"
        return run_stage

    # -- one stage -----------------------------------------------------------------
    def _execute(self, stage: Stage, ps: PipelineState) -> None:
        if ps.completed:
            return
        if ps.steps >= self.max_steps:
            revisited = {k: v for k, v in ps.visits.items() if v > 1}
            ps.finish(
                "step_limit",
                label="step_limit_exceeded",
                reason=f"step limit {self.max_steps} reached before a verdict; revisited stages: {revisited}",
                error=f"template {self.config.id!r}, stage {stage.id!r}: step limit {self.max_steps} reached",
            )
            return
        ps.steps += 1
        ps.visits[stage.id] = ps.visits.get(stage.id, 0) + 1
        ps.current_stage = stage.id
        started = time.perf_counter()
        try:
            result = stage.execute(ps, self._context(ps))
        except GraphBubbleUp:  # interrupt(): the run parks here; LangGraph re-enters this stage on resume
            ps.steps -= 1
            ps.visits[stage.id] -= 1
            raise
        except StageError as exc:
            result = StageResult(output=None, status="error", error=str(exc))
            if isinstance(exc.detail, list):
                result.attempts = exc.detail
            elif isinstance(exc.detail, Mapping) and "branch_steps" in exc.detail:
                result.branch_steps = list(exc.detail["branch_steps"])
                result.output = exc.detail.get("partial")
            elif isinstance(exc.detail, Mapping):
                result.error = dict(exc.detail)
                result.args = result.error.pop("args", None)
                result.error.setdefault("stage", stage.id)
                result.error.setdefault("template", self.config.id)
        except Exception as exc:  # a bug in a tool or backend must not leave the run without a verdict
            result = StageResult(
                output=None, status="error",
                error=f"template {self.config.id!r}, stage {stage.id!r}: {type(exc).__name__}: {exc}",
            )
        duration_ms = round((time.perf_counter() - started) * 1000, 3)
        for step in result.branch_steps:
            ps.visits[step["stage_id"]] = ps.visits.get(step["stage_id"], 0) + 1
            self._record(ps, {**step, "visit": ps.visits[step["stage_id"]], "parent": stage.id}, duration_ms)
            if step.get("status") == "ok":
                ps.stage_outputs[step["stage_id"]] = step.get("output")
            ps.stage_status[step["stage_id"]] = step.get("status", "ok")
        ps.stage_outputs[stage.id] = result.output
        ps.stage_status[stage.id] = result.status
        if result.status == "error":
            target = result.next or stage.spec.get("on_failed")
        else:
            target = self._default_next(stage, result)
        step = {
            "stage_id": stage.id,
            "stage_type": stage.type,
            "output": result.output,
            "status": result.status,
            "error": result.error,
            "score": result.score,
            "passed": result.output.get("passed") if stage.type == "llm_judge" and isinstance(result.output, Mapping) else None,
            "tool": result.tool if result.tool is not None else (stage.spec.get("tool") if stage.type == "tool_call" else None),
            "args": result.args,
            "prompt": result.prompt,
            "attempts": result.attempts,
            "visit": ps.visits[stage.id],
            "next_stage": None if stage.type == "output" else target,
        }
        if stage.type == "output" and result.status == "ok":
            ps.finish("completed")
        elif result.status == "error" and not target:
            message = result.error if isinstance(result.error, str) else str(result.error.get("message", result.error))
            if not message.startswith("template "):
                message = f"template {self.config.id!r}, stage {stage.id!r}: {message}"
            ps.finish("error", label="error", reason=message, error=message)
        else:
            ps.next_stage = target
        self._record(ps, step, duration_ms)

    def _record(self, ps: PipelineState, step: dict[str, Any], duration_ms: float) -> None:
        entry = {k: step.get(k) for k in ("stage_id", "stage_type", "output", "status", "error", "tool", "args", "score", "visit")}
        if step.get("parent"):
            entry["parent"] = step["parent"]
        ps.step_history.append(entry)
        if self.audit is not None:
            self.audit.append(
                {
                    "record_type": "stage",
                    "run_id": ps.run_id,
                    "template_id": ps.template_id,
                    "stage_id": step["stage_id"],
                    "stage_type": step["stage_type"],
                    "visit": step.get("visit"),
                    "step": ps.steps,
                    "output": step.get("output"),
                    "status": step.get("status", "ok"),
                    "error": step.get("error"),
                    "score": step.get("score"),
                    "passed": step.get("passed"),
                    "tool": step.get("tool"),
                    "args": step.get("args"),
                    "prompt": step.get("prompt"),
                    "attempts": step.get("attempts") or [],
                    "next_stage": step.get("next_stage"),
                    "parent": step.get("parent"),
                    "duration_ms": duration_ms,
                },
                redact=self._redaction(ps),
            )

    def _context(self, ps: PipelineState) -> StageContext:
        with self._runs_lock:
            return self._runs[ps.run_id][0] if ps.run_id in self._runs else self.context

    def _redaction(self, ps: PipelineState) -> Redactor:
        with self._runs_lock:
            return self._runs[ps.run_id][1] if ps.run_id in self._runs else self.redactor_for(ps)

    # -- runs ----------------------------------------------------------------------
    def redactor_for(self, ps: PipelineState) -> Redactor:
        """The run's redaction hook: the template's personal-data input fields, by key and by value."""
        return Redactor.for_input(self.config.redact_fields, ps.input)

    def run(self, value: Any = None, run_id: str | None = None, *, input_text: str | None = None,
            expected_label: str | list[str] | tuple[str, ...] | None = None) -> PipelineState:
        """Run the template on one input (text, JSON text, or a mapping) to a verdict.

        ``expected_label``: the verdict label(s) the input's author expects, recorded on the run's audit line (never
        shown to a stage) so the gate's held-out replays score verdicts against it instead of against this run.
        """
        if expected_label is not None:
            try:
                expected_label = expected_labels(expected_label)
            except ValueError as exc:
                raise DecideError(f"template {self.config.id!r}: {exc}") from None
        if value is None:
            if input_text is None:
                raise TypeError(f"template {self.config.id!r}: run() needs an input (a string or a mapping)")
            value = input_text
        if not self._checked:
            self.check()
        from agenttune_lib.decide.checkpoint import validate_run_id

        ps = PipelineState.start(self.config.id, value, run_id=validate_run_id(run_id) if run_id is not None else None)
        if self.checkpointer is not None and self.checkpointer.get_tuple(self._thread(ps.run_id)) is not None:
            # A reused id would inherit the old run's checkpoint and could be answered by its (stale) review decision.
            raise DecideError(f"template {self.config.id!r}: run id {ps.run_id!r} was already used; a new run needs a new id")
        redactor = self.redactor_for(ps)
        with self._runs_lock:
            if ps.run_id in self._runs:
                raise ValueError(f"template {self.config.id!r}: run id {ps.run_id!r} is already running")
            self._runs[ps.run_id] = (dataclasses.replace(self.context, redact=redactor), redactor)
            if expected_label is not None:
                self._expected[ps.run_id] = expected_label
        try:
            return self._run(ps, redactor)
        finally:
            with self._runs_lock:
                self._runs.pop(ps.run_id, None)

    @staticmethod
    def _thread(run_id: str) -> dict[str, Any]:
        return {"configurable": {"thread_id": run_id}}

    def _run(self, ps: PipelineState, redactor: Redactor, resume: Any = None) -> PipelineState:
        graph = self.compile()
        config = {"recursion_limit": self.max_steps * 2 + 10, **(self._thread(ps.run_id) if self.checkpointer is not None else {})}
        try:
            # durability="exit": the checkpoint is written when the run parks or ends, not after every stage.
            kwargs = {"durability": "exit"} if self.checkpointer is not None else {}
            if resume is not None:
                from langgraph.types import Command

                final = graph.invoke(Command(resume=resume), config=config, **kwargs)
            else:
                final = graph.invoke({"ps": ps}, config=config, **kwargs)
            ps = final["ps"]
            if final.get("__interrupt__"):
                return self._park(ps, final["__interrupt__"], redactor)
        except Exception as exc:  # LangGraph's own recursion guard or an engine failure still ends in a verdict
            if not ps.completed:
                ps.finish("error", label="error", reason=str(exc), error=f"template {self.config.id!r}: {type(exc).__name__}: {exc}")
        if not ps.completed:
            ps.finish("error", label="error", reason="the graph ended without reaching an output stage",
                      error=f"template {self.config.id!r}: the graph ended without reaching an output stage")
        created_at = utc_now()
        ps.destinations = self._dispatch(ps, created_at, redactor)
        if self.audit is not None:
            self.audit.append(
                {
                    "record_type": "run",
                    "run_id": ps.run_id,
                    "template_id": ps.template_id,
                    "status": ps.status,
                    "verdict": dict(ps.verdict),
                    "label": ps.verdict.get("label"),
                    "confidence": ps.verdict.get("confidence"),
                    "steps": ps.steps,
                    "visits": dict(ps.visits),
                    "max_steps": self.max_steps,
                    "input_text": ps.input_text,
                    "error": ps.error,
                    "destinations": ps.destinations,
                    "served_adapter_id": self.served_adapter_id,
                    "source": _input_source(ps.input),
                    "trusted": _input_trusted(ps.input),
                    **({"expected_label": list(self._expected[ps.run_id])} if ps.run_id in self._expected else {}),
                },
                redact=redactor,
            )
        self._expected.pop(ps.run_id, None)  # kept while a run is parked for review, so its resumed end records it
        return ps

    def _park(self, ps: PipelineState, interrupts: Any, redactor: Redactor) -> PipelineState:
        """The run waits for a review: its state is in the checkpointer; the caller gets a ``suspended`` state."""
        payload = dict(getattr(interrupts[0], "value", {}) or {})
        ps.status = "suspended"
        ps.next_stage = payload.get("stage_id")
        ps.verdict = {"label": "pending_review", "confidence": None, "reason": f"waiting for review {payload.get('review_id')}"}
        if self.audit is not None:
            self.audit.append(
                {"record_type": "suspend", "run_id": ps.run_id, "template_id": ps.template_id, "stage_id": payload.get("stage_id"),
                 "review_id": payload.get("review_id"), "steps": ps.steps, "status": "suspended"},
                redact=redactor,
            )
        return ps

    def waiting_review(self, run_id: str) -> dict[str, Any] | None:
        """The review a parked run waits for (``review_id``, ``stage_id`` …), or None when it is not parked."""
        from agenttune_lib.decide.checkpoint import validate_run_id

        if self.checkpointer is None:
            return None
        snapshot = self.compile().get_state(self._thread(validate_run_id(run_id)))
        for task in getattr(snapshot, "tasks", ()) or ():
            for intr in getattr(task, "interrupts", ()) or ():
                return dict(intr.value)
        return None

    def resume(self, run_id: str, decision: Mapping[str, Any]) -> PipelineState:
        """Continue a parked run from its checkpoint with a reviewer's decision (``decision``, ``reviewer``,
        ``comment``; ``{"decision": "timeout"}`` fails it closed). The decision must answer the review the run waits
        for (its ``review_id`` when given) and, unless it is a timeout, name its reviewer."""
        from agenttune_lib.decide.checkpoint import validate_run_id

        run_id = validate_run_id(run_id)
        waiting = self.waiting_review(run_id)
        if waiting is None:
            raise DecideError(f"template {self.config.id!r}: run {run_id!r} is not waiting for a review")
        if decision.get("review_id") not in (None, waiting["review_id"]):
            raise DecideError(f"run {run_id!r} waits for review {waiting['review_id']!r}, not {decision.get('review_id')!r} (a stale decision)")
        kind = str(decision.get("decision", "")).strip().lower()
        if kind != "timeout" and not str(decision.get("reviewer") or "").strip():
            raise DecideError(f"the decision for review {waiting['review_id']!r} names no reviewer")
        if not self._checked:
            self.check()
        snapshot = self.compile().get_state(self._thread(run_id))
        ps = snapshot.values["ps"]
        redactor = self.redactor_for(ps)
        with self._runs_lock:
            if run_id in self._runs:
                raise ValueError(f"template {self.config.id!r}: run id {run_id!r} is already running")
            self._runs[run_id] = (dataclasses.replace(self.context, redact=redactor), redactor)
        try:
            value = {**dict(decision), "review_id": waiting["review_id"], "decided_at": decision.get("decided_at") or utc_now()}
            return self._run(ps, redactor, resume=value)
        finally:
            with self._runs_lock:
                self._runs.pop(run_id, None)

    def _dispatch(self, ps: PipelineState, created_at: str, redactor: Redactor) -> list[dict[str, Any]]:
        if not self.destination_specs:
            return []
        from agenttune_lib.decide.destinations import DestinationRouter, decision_record

        record = redactor(decision_record(ps, created_at))
        try:
            router = DestinationRouter(self.destination_specs, base_dir=self.destination_base, warehouse_path=self.warehouse_path,
                                       outbox=self.outbox)
        except DecideError as exc:
            return [{"type": "router", "ok": False, "error": str(exc)}]
        return router.dispatch(record)

    @property
    def outbox(self) -> Any:
        """Where failed destination writes wait to be retried: ``<destination_base>/outbox.jsonl``."""
        from agenttune_lib.decide.destinations import Outbox

        return Outbox(self.destination_base / "outbox.jsonl")

    def retry_outbox(self) -> tuple[int, int]:
        """Re-send failed destination writes; (delivered, still failing)."""
        return self.outbox.retry(base_dir=self.destination_base, warehouse_path=self.warehouse_path)

    def run_many(self, values: Iterable[Any]) -> list[PipelineState]:
        return [self.run(v) for v in values]

    def redacted_state(self, ps: PipelineState) -> dict[str, Any]:
        """The state with the template's personal-data fields masked: what collection writes."""
        return self.redactor_for(ps)(ps.to_dict())


def _input_source(fields: Mapping[str, Any]) -> str | None:
    """Where a run's input came from (the closed loop's provenance arm reads it from the run line)."""
    value = fields.get("source") or fields.get("channel")
    return str(value) if value else None


def _input_trusted(fields: Mapping[str, Any]) -> bool:
    """Whether the input's origin is trusted: ``trusted: false`` or ``untrusted: true`` on the input marks it not."""
    return bool(fields.get("trusted", True)) and not fields.get("untrusted", False)
