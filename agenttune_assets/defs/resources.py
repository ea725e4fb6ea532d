"""Dagster resources: thin configurable handles onto the library's stores and models."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import dagster as dg
import pydantic

from agenttune_lib.config import PlatformPaths
from agenttune_lib.warehouse import Warehouse


def _default_home() -> str:
    return str(PlatformPaths.from_env().home)


class WarehouseResource(dg.ConfigurableResource):
    """The EventLog warehouse; connections are opened per call, never held across steps.

    ``path``: a DuckDB file (default ``$AGENTTUNE_HOME/warehouse.duckdb``) or a DuckLake URL
    (``ducklake:sqlite:<catalog>`` / ``ducklake:postgres:<dsn>``) with its Parquet files under ``data_path``.
    """

    path: str = ""
    data_path: str = ""

    def get(self) -> Warehouse:
        from agenttune_lib.warehouse.lake import is_lake

        path = self.path or str(PlatformPaths.from_env().warehouse)
        if not is_lake(path):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        return Warehouse(path, data_path=self.data_path or None)


class ModelsResource(dg.ConfigurableResource):
    """Where converted model checkpoints and trained adapters live."""

    path: str = ""

    def get(self) -> Path:
        path = Path(self.path or PlatformPaths.from_env().models)
        path.mkdir(parents=True, exist_ok=True)
        return path


class ArtifactsResource(dg.ConfigurableResource):
    """Where file artifacts (Parquet stages, indexes, reports) live."""

    path: str = ""

    def get(self) -> Path:
        path = Path(self.path or PlatformPaths.from_env().artifacts)
        path.mkdir(parents=True, exist_ok=True)
        return path


class DecideModelResource(dg.ConfigurableResource):
    """The model DECIDE stages call: a transformers checkpoint (default: the packaged base model) or an OpenAI-compatible endpoint."""

    backend: str = "transformers"
    checkpoint: str = ""
    endpoint: str = ""
    model_name: str = ""
    api_key_env: str = ""
    max_new_tokens: int = 24
    #: torch intra-op threads per transformers call (0: torch's default); one thread keeps short calls fast on a shared CPU.
    num_threads: int = 1

    def build(self, models_dir: Path, serving: "ServingResource | None" = None) -> tuple[object, str]:
        """(model backend, model version for provenance); with no checkpoint, the served model (base + deployed adapter)."""
        import os

        from agenttune_lib.decide.models import build_model

        if self.backend == "transformers":
            checkpoint, version = self.checkpoint, self.checkpoint
            if not checkpoint and serving is not None:
                served = serving.resolve(models_dir)
                return served.decide_model(self.max_new_tokens, self.num_threads or None), f"{served.base_path.name}+{served.served_adapter_id}"
            if not checkpoint:
                from agenttune_lib.models.base import ensure_base_model

                info = ensure_base_model(models_dir)
                checkpoint, version = str(info.path), f"{info.name}@{info.version}"
            return build_model("transformers", checkpoint=checkpoint, max_new_tokens=self.max_new_tokens, num_threads=self.num_threads or None), version
        api_key = os.environ.get(self.api_key_env) if self.api_key_env else None
        model = build_model(self.backend, endpoint=self.endpoint, model_name=self.model_name, api_key=api_key, max_new_tokens=self.max_new_tokens)
        return model, f"{self.endpoint}#{self.model_name}"


class ServingResource(dg.ConfigurableResource):
    """The deployed model: base checkpoint (default: the packaged base model) + the adapter ``DEPLOYED.json`` names, resolved per run."""

    deploy_root: str = ""
    base_checkpoint: str = ""

    def deploy_dir(self) -> Path:
        return Path(self.deploy_root or PlatformPaths.from_env().models / "deployed")

    def resolve(self, models_dir: Path | None = None):
        """The ``ServedModel`` now (a deploy or rollback is seen by the next call, no restart)."""
        from agenttune_lib.models.serving import resolve_deployed_model

        return resolve_deployed_model(self.deploy_dir(), self.base_checkpoint or None, models_dir)


CLASSIFIERS = ("rules", "llm")  # ClosedLoopResource.classifier's names
CORRECTORS = ("served", "llm", "reference")  # ClosedLoopResource.corrector's names


class ClosedLoopResource(dg.ConfigurableResource):
    """The self-healing loop's settings: buffer, audit logs to read, trigger thresholds (paper defaults), deploy root."""

    buffer: str = "default"
    capacity: int = 10_000
    audit_paths: list[str] = []
    deploy_root: str = ""
    min_buffer: int = 50
    dominance_ratio: float = 0.70
    min_accepted: int = 30
    drift_sigma: float = 1.5
    novel_min_count: int = 3
    staleness_hours: float = 6.0
    staleness_min_buffer: int = 10
    max_drop_rate: float = 0.60
    # The deployment gate: a fixed-size held-out sample, non-inferiority margin, the share of batch failures the candidate must fix.
    gate_holdout_size: int = 48
    gate_noninferiority_margin: float = 0.05
    gate_min_fix_rate: float = 0.5
    gate_require_trajectory_arm: bool = True
    # What each candidate is judged on: targets per training algorithm (superiority, "suite/metric@margin") and guards
    # (non-inferiority within each margin); a criterion needs gate_min_items paired held-out items (guards: DECIDE its own).
    gate_targets: dict[str, list[str]] = {"distill": ["qa/valid_call@0.0"]}
    # margins: 0.15 lets 24 agreeing items pass (rule of three: 3/24 = 0.125) and still refuses a drop of one item in six
    gate_guards: list[str] = ["bfcl_platform/score:irrelevance@0.15", "bfcl_platform/score:simple_python@0.15", "decide/verdict_accuracy@0.25"]
    gate_min_items: int = 20
    gate_decide_min_items: int = 10
    # 2: the gate replays the baseline and the candidate at once, one core each (the same outcomes as in turn); 1: in turn.
    gate_replay_workers: int = 2
    # The root-cause classifier: "rules" (default), or "llm" over an OpenAI-compatible endpoint (rules still decide first).
    classifier: str = "rules"
    classifier_endpoint: str = ""
    classifier_model: str = ""
    classifier_api_key_env: str = ""
    open_run_timeout_s: float = 3600.0
    # The corrector: "served" (the deployed model regenerates the failing stage for the failing input), "llm" (an
    # OpenAI-compatible endpoint, e.g. a teacher), or "reference" (legacy: copies the most similar past success's output).
    corrector: str = "served"
    corrector_endpoint: str = ""
    corrector_model: str = ""
    corrector_api_key_env: str = ""

    @pydantic.model_validator(mode="after")
    def _settings_are_usable(self) -> "ClosedLoopResource":
        """Refuse a bad setting when the resource is built (a run's first step that uses it), not hours later at the gate."""
        if isinstance(self.capacity, bool) or self.capacity < 1:
            raise ValueError(f"closed_loop.capacity must be an integer >= 1, got {self.capacity!r}")
        for name, allowed in (("classifier", CLASSIFIERS), ("corrector", CORRECTORS)):
            if getattr(self, name) not in allowed:
                one_of = " or ".join([", ".join(repr(a) for a in allowed[:-1]), repr(allowed[-1])])
                raise ValueError(f"closed_loop.{name} must be {one_of}, got {getattr(self, name)!r}")
        try:
            self.trigger_config()
            self.detector()
            self.gate_config()
        except ValueError as exc:  # name the resource field the user set, where the library names its own
            msg = re.sub(r"GateConfig\.(\w+)", lambda m: f"closed_loop.gate_{m.group(1)}" if f"gate_{m.group(1)}" in type(self).model_fields
                         else m.group(0), str(exc))
            raise ValueError(msg if msg.startswith("closed_loop.") else f"closed_loop resource: {msg}") from None
        return self

    def build_corrector_model(self, serving: "ServingResource", models_dir: Path | None = None):
        """The model that regenerates corrections, or None for the reference corrector."""
        import os

        if self.corrector == "reference":
            return None
        if self.corrector == "served":
            return serving.resolve(models_dir).decide_model()
        if not self.corrector_endpoint or not self.corrector_model:  # "llm": the only name left (checked when built)
            raise ValueError("closed_loop.corrector='llm' needs corrector_endpoint and corrector_model")
        from agenttune_lib.decide.models import OpenAICompatibleModel

        key = os.environ.get(self.corrector_api_key_env) if self.corrector_api_key_env else None
        return OpenAICompatibleModel(self.corrector_endpoint, self.corrector_model, api_key=key, json_mode=True)

    def gate_config(self):
        from agenttune_lib.closed_loop import GateConfig

        from agenttune_lib.closed_loop.criteria import criteria_from_specs

        guards = tuple(dataclasses.replace(c, min_n=self.gate_decide_min_items) if c.suite == "decide" else c
                       for c in criteria_from_specs(self.gate_guards, self.gate_noninferiority_margin, self.gate_min_items))
        return GateConfig(
            holdout_size=self.gate_holdout_size, noninferiority_margin=self.gate_noninferiority_margin, min_fix_rate=self.gate_min_fix_rate,
            require_trajectory_arm=self.gate_require_trajectory_arm, guards=guards, replay_workers=self.gate_replay_workers,
            targets={k: criteria_from_specs(v, 0.0, self.gate_min_items) for k, v in self.gate_targets.items()},
        )

    def build_classifier(self):
        """The FailureClassifier this resource names: rules only, or rules then an LLM over an OpenAI-compatible endpoint."""
        import os

        from agenttune_lib.closed_loop import FailureClassifier

        if self.classifier == "rules":
            return FailureClassifier()
        if not self.classifier_endpoint or not self.classifier_model:
            raise ValueError("closed_loop.classifier='llm' needs classifier_endpoint and classifier_model")
        from agenttune_lib.models.openai_compat import chat_completion

        key = os.environ.get(self.classifier_api_key_env) if self.classifier_api_key_env else None

        def llm(prompt: str) -> str:
            return chat_completion(self.classifier_endpoint, self.classifier_model, [{"role": "user", "content": prompt}],
                                   api_key=key, max_tokens=128, temperature=0.0).text

        return FailureClassifier(llm=llm)

    def detector(self):
        from agenttune_lib.closed_loop import DetectorConfig, FailureDetector

        return FailureDetector(DetectorConfig(open_run_timeout_s=self.open_run_timeout_s))

    def trigger_config(self):
        import datetime as dt

        from agenttune_lib.closed_loop import TriggerConfig

        return TriggerConfig(
            min_buffer=self.min_buffer, dominance_ratio=self.dominance_ratio, min_accepted=self.min_accepted,
            drift_sigma=self.drift_sigma, novel_min_count=self.novel_min_count,
            staleness=dt.timedelta(hours=self.staleness_hours), staleness_min_buffer=self.staleness_min_buffer,
            max_drop_rate=self.max_drop_rate,
        )

    def audit_files(self) -> list[Path]:
        """The configured audit logs, else every ``audit.jsonl`` under ``$AGENTTUNE_HOME``."""
        if self.audit_paths:
            return [Path(p) for p in self.audit_paths]
        return sorted(PlatformPaths.from_env().home.rglob("audit.jsonl"))

    def deploy_dir(self) -> Path:
        return Path(self.deploy_root or PlatformPaths.from_env().models / "deployed")


class TeacherModelResource(dg.ConfigurableResource):
    """The teacher the spine runs for teacher_trajectories: a converted checkpoint, else the deployed model (the base, by default
    the packaged SmolLM2, plus the adapter ``DEPLOYED.json`` names), and its decoding settings."""

    checkpoint: str = ""
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    num_threads: int = 1

    def build(self, models_dir: Path, serving: "ServingResource | None" = None) -> tuple[object, str]:
        """(chat generator, model version for provenance); the generator's ``served_adapter_id`` names the adapter it runs."""
        from agenttune_lib.models.generate import GenerationConfig, load_chat_generator
        from agenttune_lib.models.serving import base_adapter_id

        config = GenerationConfig(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed,
            num_threads=self.num_threads or None,
        )
        if self.checkpoint:
            gen = load_chat_generator(self.checkpoint, config)
            gen.served_adapter_id = base_adapter_id(self.checkpoint)
            return gen, self.checkpoint
        served = (serving or ServingResource()).resolve(models_dir)
        gen = served.chat_generator(config)
        from agenttune_lib.models.base import ensure_base_model

        info = ensure_base_model(models_dir) if not (serving and serving.base_checkpoint) else None
        base = f"{info.name}@{info.version}" if info else served.base_path.name
        return gen, f"{base}+{served.adapter_id}" if served.adapter_id else base  # the bare base keeps its plain version


class RayResource(dg.ConfigurableResource):
    """Where training and rollouts run: Ray actors on a local cluster sized to the machine, or ``address`` (else ``$RAY_ADDRESS``)."""

    enabled: bool = True
    address: str = ""
    num_cpus: int = 0
    rollout_actors: int = 2

    def run(self, fn, *args, task_cpus: float | None = 1.0, reserve_cpus: float = 0.0, **kwargs):
        """Run ``fn(*args, **kwargs)`` as a Ray task (GPU-placed when a GPU exists), or in-process when disabled.

        ``task_cpus=None``: the task holds every CPU of one node but ``reserve_cpus`` (for the actors it starts)."""
        if not self.enabled:
            return fn(*args, **kwargs)
        import os

        import ray

        from agenttune_lib.rl.ray_engine import ensure_ray, run_on_ray

        if self.address:
            os.environ["RAY_ADDRESS"] = self.address
        started = not ray.is_initialized()
        ensure_ray(num_cpus=self.num_cpus or None)
        try:
            return run_on_ray(fn, *args, num_cpus=task_cpus, reserve_cpus=reserve_cpus, **kwargs)
        finally:
            if started:
                ray.shutdown()


def default_resources() -> dict[str, dg.ConfigurableResource]:
    """The embedded default: everything under ``$AGENTTUNE_HOME`` (./.agenttune)."""
    return {
        "warehouse": WarehouseResource(),
        "models": ModelsResource(),
        "artifacts": ArtifactsResource(),
        "closed_loop": ClosedLoopResource(),
        "serving": ServingResource(),
        "decide_model": DecideModelResource(),
        "ray": RayResource(),
        "teacher": TeacherModelResource(),
    }
