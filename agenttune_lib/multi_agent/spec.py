"""The YAML graph spec of a multi-agent GRPO run (policies, judges, router, training) and the graph it builds."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["PolicySpec", "JudgeSpec", "RouterSpec", "TrainSpec", "GraphSpec", "load_graph_spec", "default_spec_path", "build_graph", "RoundRobinRouter", "load_policy_model"]

#: Model references a spec may use besides a checkpoint path; ``deployed`` is the base plus the adapter DEPLOYED.json names.
MODEL_REFS = ("base", "deployed", "tiny", "tiny-llama")


@dataclasses.dataclass
class PolicySpec:
    """One rollout node: a policy model, its decoding, and where its prompt comes from."""

    name: str
    model: str = "base"
    trainable: bool = False
    prompt_from: str | None = None
    system_prompt: str | None = None
    max_new_tokens: int = 16
    temperature: float = 1.0
    max_tool_turns: int = 0
    tools: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class JudgeSpec:
    """One judge node: a registry reward (``kind: reward``), an LLMJudge over a model (``kind: llm``),
    content-word overlap with the task or another policy's text (``kind: overlap``, ``reference``), or
    the reference answer's normalised token F1 with question restating penalised (``kind: answer``)."""

    name: str
    kind: str = "reward"
    reward: str | None = None
    reference: str = "task"
    model: str | None = None
    criteria: str | None = None
    weight: float = 1.0
    mode: str = "absolute"
    max_new_tokens: int = 16
    penalize_copy: bool = False  # overlap: scale by the share of the agent's words NOT copied from the task (a parrot scores 0)


@dataclasses.dataclass
class RouterSpec:
    """Pick one rollout node per batch: ``round_robin`` over the policies, or ``fixed`` to ``choice``."""

    kind: str = "round_robin"
    choice: str | None = None


@dataclasses.dataclass
class TrainSpec:
    """GRPO settings for the run."""

    max_steps: int = 2
    learning_rate: float = 5e-4
    batch_size: int = 4
    num_generations: int = 2
    max_completion_length: int = 16
    lora_r: int = 8
    max_prompts: int = 8
    seed: int = 0


@dataclasses.dataclass
class GraphSpec:
    """A whole multi-agent GRPO run: exactly one trainable policy, one or more judges."""

    name: str
    policies: list[PolicySpec]
    judges: list[JudgeSpec]
    aggregate: str = "mean"
    router: RouterSpec | None = None
    train: TrainSpec = dataclasses.field(default_factory=TrainSpec)

    def __post_init__(self) -> None:
        from agenttune_lib.multi_agent.judges import AGGREGATES

        where = f"graph spec {self.name!r}"
        if not self.policies:
            raise ValueError(f"{where}: 'policies' is empty; a graph needs at least one rollout policy")
        if not self.judges:
            raise ValueError(f"{where}: 'judges' is empty; the GRPO reward comes from the judge panel")
        names = [p.name for p in self.policies] + [j.name for j in self.judges]
        for n in names:
            if not isinstance(n, str) or not n.isidentifier():
                raise ValueError(f"{where}: name {n!r} must be an identifier")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"{where}: duplicate node name(s) {dup}")
        trainable = [p.name for p in self.policies if p.trainable]
        if len(trainable) != 1:
            raise ValueError(f"{where}: exactly one policy must be 'trainable: true' (the GRPO policy), got {trainable}")
        if self.trainable.model == "deployed":
            raise ValueError(f"{where}: the trainable policy {self.trainable.name!r} cannot be 'deployed' (GRPO trains a fresh LoRA "
                             "on 'base', 'tiny' or a checkpoint); use 'deployed' for frozen policies and judges")
        seen: list[str] = []
        for p in self.policies:
            if p.prompt_from is not None and p.prompt_from not in seen:
                raise ValueError(f"{where}: policy {p.name!r} has prompt_from {p.prompt_from!r}, which is not an earlier policy {seen}")
            seen.append(p.name)
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"{where}: aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")
        from agenttune_lib.rl.rewards import REWARD_REGISTRY

        for j in self.judges:
            if j.kind == "reward":
                if isinstance(j.reward, str) and ":" in j.reward:  # package.module:attr, as for tools and rewards elsewhere
                    from agenttune_lib.rl.rewards import resolve_reward

                    try:
                        resolve_reward(j.reward)
                    except KeyError as exc:
                        raise ValueError(f"{where}: judge {j.name!r}: {exc.args[0]}") from None
                elif j.reward not in REWARD_REGISTRY:
                    raise ValueError(f"{where}: judge {j.name!r} names reward {j.reward!r}; registered: {sorted(REWARD_REGISTRY)}")
            elif j.kind == "llm":
                if not j.model:
                    raise ValueError(f"{where}: judge {j.name!r} (kind llm) needs 'model'")
            elif j.kind == "overlap":
                if j.reference != "task" and j.reference not in [p.name for p in self.policies]:
                    raise ValueError(f"{where}: judge {j.name!r} reference {j.reference!r} is neither 'task' nor a policy")
            elif j.kind != "answer":
                raise ValueError(f"{where}: judge {j.name!r} has kind {j.kind!r}; expected 'reward', 'llm', 'overlap' or 'answer'")
            if j.weight < 0:
                raise ValueError(f"{where}: judge {j.name!r} has a negative weight {j.weight}")
        if self.router is not None:
            if self.router.kind not in ("round_robin", "fixed"):
                raise ValueError(f"{where}: router kind must be 'round_robin' or 'fixed', got {self.router.kind!r}")
            if self.router.kind == "fixed" and self.router.choice not in [p.name for p in self.policies]:
                raise ValueError(f"{where}: fixed router choice {self.router.choice!r} is not a policy")
            chained = [p.name for p in self.policies if p.prompt_from]
            if chained:
                raise ValueError(f"{where}: with a router the policies are alternatives; {chained} use prompt_from")
        t = self.train
        if t.max_steps < 1 or t.num_generations < 2 or t.batch_size % t.num_generations:
            raise ValueError(f"{where}: train needs max_steps >= 1, num_generations >= 2 and batch_size divisible by num_generations, got {t}")

    @property
    def trainable(self) -> PolicySpec:
        return next(p for p in self.policies if p.trainable)


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(fields)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_graph_spec(source: str | Path | Mapping[str, Any]) -> GraphSpec:
    """A GraphSpec from a YAML file path, YAML text, or an already-parsed mapping; errors name the file and key."""
    import yaml

    where = "graph spec"
    if isinstance(source, Mapping):
        data = dict(source)
    else:
        path = Path(source) if not (isinstance(source, str) and "\n" in source) else None
        if path is not None:
            if not path.exists():
                raise FileNotFoundError(f"graph spec {path} does not exist")
            where, text = f"graph spec {path}", path.read_text()
        else:
            text = str(source)
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{where}: not valid YAML ({exc})") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping at the top level")
    allowed = {"name", "policies", "judges", "aggregate", "router", "train"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown top-level key(s) {unknown}; allowed: {sorted(allowed)}")
    policies = [_build(PolicySpec, p, f"{where} policies[{i}]") for i, p in enumerate(data.get("policies") or [])]
    judges = [_build(JudgeSpec, j, f"{where} judges[{i}]") for i, j in enumerate(data.get("judges") or [])]
    router = _build(RouterSpec, data["router"], f"{where} router") if data.get("router") else None
    train = _build(TrainSpec, data.get("train") or {}, f"{where} train")
    try:
        return GraphSpec(name=str(data.get("name", "graph")), policies=policies, judges=judges,
                         aggregate=data.get("aggregate", "mean"), router=router, train=train)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def default_spec_path() -> Path:
    """The packaged example spec (SmolLM2 planner and solver, a two-judge panel)."""
    return Path(__file__).parent / "specs" / "default.yaml"


class RoundRobinRouter:
    """A router cycling through rollout nodes batch by batch."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        self._cycle = itertools.cycle(self.names)

    def __call__(self, prompts: Any) -> str:
        return next(self._cycle)


def load_policy_model(ref: str, base_model_path: str | Path | None, seed: int = 0, served: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) for a spec model reference: ``base`` (the platform base model), ``deployed`` (``served``, a
    ``ServedModel``: the base plus the deployed adapter), ``tiny``/``tiny-llama``, or a path."""
    if ref == "deployed":
        if served is None:
            raise ValueError("model 'deployed' needs the deployed model (served=resolve_deployed_model(...))")
        from agenttune_lib.models.serving import load_served

        return load_served(served.base_path, served.adapter_path)
    if ref in ("tiny", "tiny-llama"):
        from agenttune_lib.models.tiny import build_tiny_model

        return build_tiny_model(arch="llama" if ref == "tiny-llama" else "qwen2", seed=seed)
    from agenttune_lib.models.base import load_base_model

    if ref == "base":
        if base_model_path is None:
            raise ValueError("model 'base' needs the platform base model's path (base_model_path=)")
        return load_base_model(base_model_path)
    if not Path(ref).exists():
        raise ValueError(f"model {ref!r} is neither one of {MODEL_REFS} nor an existing checkpoint directory")
    return load_base_model(ref)


def _handoff(source: str) -> Callable[..., list[Any]]:
    """A function node: the task plus the upstream agent's final response, as the next agent's prompt."""

    def handoff(prompts: list[Any], upstream: Mapping[str, Any]) -> list[Any]:
        out = []
        for p, r in zip(prompts, upstream.get("responses") or [""] * len(prompts)):
            note = f"\n\nA teammate ({source}) wrote:\n{r}"
            if isinstance(p, str):
                out.append(p + note)
            else:
                msgs = [dict(m) for m in p]
                last = max(i for i, m in enumerate(msgs) if m.get("role") == "user")
                msgs[last]["content"] = str(msgs[last].get("content", "")) + note
                out.append(msgs)
        return out

    return handoff


def build_graph(
    spec: GraphSpec,
    base_model_path: str | Path | None = None,
    sink: Callable[[list[Any]], None] | None = None,
    task_metadata: Mapping[str, Mapping[str, Any]] | None = None,
    models: Mapping[str, tuple[Any, Any]] | None = None,
    served: Any = None,
) -> Any:
    """The AgentTuneGraph a spec describes; the trainable policy is the GRPO trainer's own model.

    ``models`` maps a spec model reference to an already-loaded (model, tokenizer) to share; ``served`` is the
    deployed model (``ServedModel``) that ``model: deployed`` nodes run.
    """
    from agenttune_lib.multi_agent.graph import AgentTuneGraph
    from agenttune_lib.multi_agent.judges import AnswerJudge, OverlapJudge, RewardJudge
    from agenttune_lib.rl.judge import LLMJudge, TransformersJudgeModel
    from agenttune_lib.rl.rollout import RolloutConfig, TransformersRolloutEngine
    from agenttune_lib.rl.train import resolve_tools

    cache: dict[str, tuple[Any, Any]] = dict(models or {})

    def model(ref: str) -> tuple[Any, Any]:
        if ref not in cache:
            cache[ref] = load_policy_model(ref, base_model_path, seed=spec.train.seed + len(cache) + 1, served=served)
        return cache[ref]

    graph = AgentTuneGraph(aggregate=spec.aggregate, sink=sink, task_metadata=task_metadata, name=spec.name)
    for p in spec.policies:
        config = RolloutConfig(max_new_tokens=p.max_new_tokens, temperature=p.temperature, max_tool_turns=p.max_tool_turns,
                               system_prompt=p.system_prompt)
        tools = resolve_tools(p.tools) if p.tools else None
        inputs = None
        if p.prompt_from:
            hand = f"{p.name}_prompt"
            graph.add_node(hand, _handoff(p.prompt_from), inputs={"upstream": p.prompt_from})
            inputs = {"prompts": hand}
        engine = None if p.trainable else TransformersRolloutEngine(*model(p.model), config)
        graph.add_rollout(p.name, engine, tools=tools, config=config, inputs=inputs, trainable=p.trainable)
    for j in spec.judges:
        if j.kind == "reward":
            judge: Any = RewardJudge(j.reward)  # type: ignore[arg-type]
        elif j.kind == "overlap":
            judge = OverlapJudge(j.reference, penalize_copy=j.penalize_copy)
        elif j.kind == "answer":
            judge = AnswerJudge()
        else:
            m, tok = model(j.model)  # type: ignore[arg-type]
            kwargs = {"criteria": j.criteria} if j.criteria else {}
            judge = LLMJudge(TransformersJudgeModel(m, tok, max_new_tokens=j.max_new_tokens), seed=spec.train.seed, **kwargs)
        graph.add_judge(j.name, judge, weight=j.weight, mode=j.mode)
    if spec.router is not None:
        names = [p.name for p in spec.policies]
        graph.set_router(RoundRobinRouter(names) if spec.router.kind == "round_robin" else (lambda prompts, _c=spec.router.choice: _c))
    graph.compile()
    return graph
