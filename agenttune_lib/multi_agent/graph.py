"""AgentTuneGraph: rollout, function and judge nodes auto-wired by parameter name into one LangGraph StateGraph.

Each node reads the state keys its parameters name and writes its output under its own
name (or under ``outputs``). Wiring is resolved at compile time: two producers of one key,
a required parameter nobody produces, or a cycle is a ``GraphCompileError`` naming the node
and the parameter. The compiled graph yields three callables: ``compile_rollout()`` (TRL
GRPO ``rollout_func``), ``compile_grpo_reward()`` (one judge-panel score per completion) and
``compile_reward()`` (trajectory -> float).
"""
from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agenttune_lib.events import EventLog
from agenttune_lib.multi_agent.episode import build_episodes, rollout_logs, with_judge_rewards
from agenttune_lib.multi_agent.judges import AGGREGATES, JudgeAdapter, aggregate_scores
from agenttune_lib.multi_agent.graph_nodes import (
    _EPISODE,
    _PANEL,
    _ROUTE,
    _ROUTER,
    BUILTIN_KEYS,
    GRAPH_INPUTS,
    GraphCompileError,
    _check_name,
    _gid,
    _is_rollout_func,
    _Node,
    _signature,
    _typed_outputs,
)
from agenttune_lib.multi_agent.graph_trl import GraphTrainerHooks

__all__ = ["AgentTuneGraph", "GraphCompileError", "GRAPH_INPUTS", "BUILTIN_KEYS"]


class AgentTuneGraph(GraphTrainerHooks):
    """Compose rollout nodes (one per policy) and judge nodes into one StateGraph; compile to GRPO's rollout and reward.

    ``aggregate`` combines the judge panel: ``mean``, ``median`` or ``weighted`` (each judge's
    ``weight``; or ``weights`` by judge name). ``rollouts``/``nodes``/``judges`` add nodes up front
    (judges as a mapping, or a list named by their ``name`` or position). ``sink`` receives every batch's scored multi-agent EventLogs (e.g.
    ``agenttune_lib.rl.warehouse_sink``). ``task_metadata`` maps a task text to metadata merged
    into its episode (e.g. the reference ``answer`` rule judges compare against).
    """

    def __init__(
        self,
        aggregate: str = "mean",
        sink: Callable[[list[EventLog]], None] | None = None,
        task_metadata: Mapping[str, Mapping[str, Any]] | None = None,
        name: str = "agenttune_graph",
        router: Callable[..., Any] | None = None,
        rollouts: Mapping[str, Any] | None = None,
        nodes: Mapping[str, Any] | None = None,
        judges: Mapping[str, Any] | Sequence[Any] | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        if aggregate not in AGGREGATES:
            raise ValueError(f"AgentTuneGraph: aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        self.aggregate = aggregate
        self.sink = sink
        self.task_metadata = dict(task_metadata or {})
        self.name = name
        self._nodes: dict[str, _Node] = {}
        self._router: _Node | None = None
        self._compiled: Any = None
        self._router_takes_state = False
        self._plan: list[str] = []
        self.weights: dict[str, float] = {}
        self.history: list[dict[str, Any]] = []
        self._timings: dict[str, float] = {}
        for node_name, policy in (rollouts or {}).items():
            self.add_rollout(node_name, policy)
        for node_name, node in (nodes or {}).items():
            self.add_node(node_name, node)
        judge_items = judges.items() if isinstance(judges, Mapping) else [
            (getattr(j, "name", None) if isinstance(getattr(j, "name", None), str) else f"judge_{i}", j) for i, j in enumerate(judges or [])
        ]
        for node_name, judge in judge_items:
            self.add_judge(node_name, judge, weight=float((weights or {}).get(node_name, 1.0)))
        if router is not None:
            self.set_router(router)

    # -- building ------------------------------------------------------------------
    def _add(self, node: _Node) -> "AgentTuneGraph":
        _check_name(node.name, "node")
        if node.name in self._nodes:
            raise GraphCompileError(f"node {node.name!r} is already in the graph")
        if node.name in GRAPH_INPUTS or node.name in BUILTIN_KEYS:
            raise GraphCompileError(f"node {node.name!r}: the name is reserved (graph inputs {GRAPH_INPUTS}, built-ins {BUILTIN_KEYS})")
        for param, key in node.inputs.items():
            if param not in node.params:
                raise GraphCompileError(f"node {node.name!r}: inputs maps {param!r}, which is not one of its parameters {sorted(node.params)}")
            _check_name(key, f"node {node.name!r} input")
        for out in node.outputs:
            _check_name(out, f"node {node.name!r} output")
        self._nodes[node.name] = node
        self._compiled = None
        return self

    def add_rollout(
        self,
        name: str,
        policy: Any = None,
        *,
        tools: Any = None,
        config: Any = None,
        inputs: Mapping[str, str] | None = None,
        trainable: bool = False,
    ) -> "AgentTuneGraph":
        """A rollout node for one policy: ``None`` (the GRPO trainer's own policy), a RolloutEngine, or a callable.

        Engines (and ``None``) go through ``create_rollout_fn``; a callable is called with its
        parameters wired from the state and must return the rollout contract (at least
        ``trajectories`` or ``responses``; ``prompt_ids``/``completion_ids``/``logprobs`` when its
        tokens are what GRPO trains on). Output: the rollout dict under ``name``.
        """
        captured: list[Any] = []
        if policy is None or callable(getattr(policy, "rollout", None)):
            from agenttune_lib.rl.rollout import create_rollout_fn

            def capture(logs: list[EventLog]) -> None:
                captured.append(list(logs))

            fn = create_rollout_fn(policy, tools=tools, sink=capture, config=config)
        elif callable(policy):
            fn = policy
        else:
            raise TypeError(f"rollout node {name!r}: policy must be None, a RolloutEngine or a callable, got {type(policy).__name__}")
        node = _Node(name, "rollout", fn, _signature(name, fn), dict(inputs or {}), (name,), trainable=trainable, captured=captured)
        return self._add(node)

    def add_judge(
        self, name: str, judge: Any, *, weight: float = 1.0, mode: str = "absolute", inputs: Mapping[str, str] | None = None
    ) -> "AgentTuneGraph":
        """A judge node: scores the batch's merged episodes (state ``episodes``); output: its scores under ``name``."""
        adapter = JudgeAdapter(name, judge, mode)
        if not isinstance(weight, (int, float)) or weight < 0:
            raise ValueError(f"judge {name!r}: weight must be a non-negative number, got {weight!r}")

        def judge_node(episodes: Sequence[EventLog]) -> list[float]:
            return adapter.score(episodes)

        node = _Node(name, "judge", judge_node, {"episodes": True}, dict(inputs or {}), (name,), judge=adapter)
        self._add(node)
        self.weights[name] = float(weight)
        return self

    def add_node(
        self, name: str, node: Any, *, kind: str | None = None, inputs: Mapping[str, str] | None = None,
        outputs: Sequence[str] | None = None, **opts: Any,
    ) -> "AgentTuneGraph":
        """Any node, duck-typed (or forced with ``kind`` = rollout | judge | function).

        Judges: an LLMJudge or an object with ``evaluate_trajectory``. Rollouts: a rollout engine
        (``.rollout``), or a TRL-style ``rollout_func(prompts, trainer)`` such as ``create_rollout_fn``
        returns. Anything else callable is a function node: its output goes under ``name``, or,
        with ``outputs`` (or a TypedDict return annotation), it returns a mapping with exactly those keys.
        """
        if kind not in (None, "rollout", "judge", "function"):
            raise ValueError(f"node {name!r}: kind must be 'rollout', 'judge' or 'function', got {kind!r}")
        is_judge = hasattr(node, "evaluate_trajectory") or callable(getattr(node, "evaluate", None))
        if kind == "judge" or kind is None and is_judge:
            return self.add_judge(name, node, inputs=inputs, **opts)
        if kind == "rollout" or kind is None and (callable(getattr(node, "rollout", None)) or _is_rollout_func(node)):
            return self.add_rollout(name, node, inputs=inputs, **opts)
        if not callable(node):
            raise TypeError(f"node {name!r}: {type(node).__name__} is neither a judge, a rollout engine nor a callable")
        if opts:
            raise TypeError(f"node {name!r}: a function node takes no options {sorted(opts)}")
        outs = tuple(outputs) if outputs else _typed_outputs(node) or (name,)
        return self._add(_Node(name, "function", node, _signature(name, node), dict(inputs or {}), outs))

    def set_router(self, router: Callable[..., Any], inputs: Mapping[str, str] | None = None) -> "AgentTuneGraph":
        """Route each batch to ONE rollout node: ``router(<wired params>)`` (or ``router(state)``) -> node name or index."""
        if not callable(router):
            raise TypeError(f"router must be callable, got {type(router).__name__}")
        params = _signature("router", router)
        self._router = _Node(_ROUTER, "router", router, params, dict(inputs or {}), ())
        self._router_takes_state = list(params) == ["state"] and not inputs
        self._compiled = None
        return self

    # -- wiring ----------------------------------------------------------------------
    @property
    def rollout_nodes(self) -> list[str]:
        return [n for n, node in self._nodes.items() if node.kind == "rollout"]

    @property
    def judge_nodes(self) -> list[str]:
        return [n for n, node in self._nodes.items() if node.kind == "judge"]

    def _producers(self) -> dict[str, str]:
        producers: dict[str, str] = {k: "<graph input>" for k in GRAPH_INPUTS}
        producers.update({"episodes": _EPISODE, "token_agent": _EPISODE, "route": _ROUTE if self._router else _EPISODE,
                          "trajectories": _PANEL, "judge_rewards": _PANEL, "judge_scores": _PANEL})
        for node in self._nodes.values():
            for out in node.outputs:
                if out in producers:
                    other = producers[out]
                    raise GraphCompileError(
                        f"node {node.name!r} produces {out!r}, which {other if other.startswith('<') else repr(other)} already produces; "
                        "rename one output (outputs=...) or the node"
                    )
                producers[out] = node.name
        return producers

    def wiring(self) -> dict[str, dict[str, str]]:
        """node -> {parameter: producing node}; raises GraphCompileError for unresolved wiring."""
        producers = self._producers()
        out: dict[str, dict[str, str]] = {}
        nodes = list(self._nodes.values()) + ([self._router] if self._router else [])
        for node in nodes:
            wired = {}
            if node.kind == "router" and self._router_takes_state:
                out[node.name] = {"state": "<graph input>"}
                continue
            for param, required in node.params.items():
                key = node.key_of(param)
                if key in producers:
                    wired[param] = producers[key]
                elif required:
                    known = sorted(k for k in producers)
                    raise GraphCompileError(
                        f"node {node.name!r}: parameter {param!r} (state key {key!r}) has no producer; available keys: {known}"
                    )
            out[node.name] = wired
        return out

    def _plan_order(self) -> list[str]:
        """Execution order: a deterministic topological order of the data dependencies (router: pre, route, one rollout, rest)."""
        import networkx as nx

        if not self.rollout_nodes:
            raise GraphCompileError("the graph has no rollout node; add one with add_rollout(name, policy)")
        wiring = self.wiring()
        g = nx.DiGraph()
        order_key = {name: i for i, name in enumerate(itertools.chain(self._nodes, [_EPISODE, _PANEL]))}
        g.add_nodes_from(order_key)
        for name, wired in wiring.items():
            if name == _ROUTER:
                continue
            for producer in wired.values():
                if producer not in (_ROUTE, "<graph input>"):
                    g.add_edge(producer, name)
        for r in self.rollout_nodes:
            g.add_edge(r, _EPISODE)
        for j in self.judge_nodes:
            g.add_edge(j, _PANEL)
            g.add_edge(_EPISODE, j)
        g.add_edge(_EPISODE, _PANEL)
        try:
            cycle = nx.find_cycle(g)
        except nx.NetworkXNoCycle:
            cycle = None
        if cycle:
            path = " -> ".join(u for u, _ in cycle) + f" -> {cycle[-1][1]}"
            raise GraphCompileError(f"the wiring has a cycle: {path}")
        order = list(nx.lexicographical_topological_sort(g, key=lambda n: order_key[n]))
        if self._router is None:
            return order
        rollouts = set(self.rollout_nodes)
        downstream = set().union(*(nx.descendants(g, r) for r in rollouts))
        for name, wired in wiring.items():
            for param, producer in wired.items():
                if producer in rollouts and name not in (_EPISODE,):
                    raise GraphCompileError(
                        f"node {name!r}: parameter {param!r} reads rollout node {producer!r}'s output, but with a router only "
                        "one rollout node runs per batch; read 'episodes' or 'trajectories' instead"
                    )
        for r in rollouts:
            late = [p for p in wiring[r].values() if p in downstream]
            if late:
                raise GraphCompileError(f"rollout node {r!r} depends on {late}, which run after the routed rollout")
        router_deps = [p for p in wiring[_ROUTER].values() if p in downstream or p in rollouts]
        if router_deps:
            raise GraphCompileError(f"router: its parameters read {router_deps}, which run after routing")
        pre = [n for n in order if n not in rollouts and n not in downstream]
        rest = [n for n in order if n in downstream]
        return pre + [_ROUTE] + [n for n in order if n in rollouts] + rest

    # -- LangGraph -------------------------------------------------------------------
    def compile(self) -> Any:
        """Resolve the wiring and build the LangGraph StateGraph (compiled); errors name the node and parameter."""
        from typing import TypedDict

        from langgraph.graph import END, START, StateGraph

        plan = self._plan_order()
        keys = set(GRAPH_INPUTS) | set(BUILTIN_KEYS)
        for node in self._nodes.values():
            keys.update(node.outputs)
        state_cls = TypedDict("AgentTuneState", {k: Any for k in sorted(keys)}, total=False)  # type: ignore[misc]
        sg = StateGraph(state_cls)
        rollouts = self.rollout_nodes
        for step in plan:
            sg.add_node(_gid(step), self._step(step))
        routed = self._router is not None
        prev = START
        i = 0
        while i < len(plan):
            step = plan[i]
            if routed and step == _ROUTE:
                sg.add_edge(prev, _gid(_ROUTE))
                after = plan[i + 1 + len(rollouts)]
                sg.add_conditional_edges(_gid(_ROUTE), lambda s: _gid(s["route"]), {_gid(r): _gid(r) for r in rollouts})
                for r in rollouts:
                    sg.add_edge(_gid(r), _gid(after))
                prev = None
                i += 1 + len(rollouts)
                continue
            if prev is not None:
                sg.add_edge(prev, _gid(step))
            prev = _gid(step)
            i += 1
        sg.add_edge(prev, END)
        self._plan = plan
        self._compiled = sg.compile()
        return self._compiled

    @property
    def plan(self) -> list[str]:
        """The compiled execution order (node names; ``__route__``/``__episode__``/``__panel__`` are the graph's own steps)."""
        if self._compiled is None:
            self.compile()
        return list(self._plan)

    def _step(self, step: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
        fn = {_ROUTE: self._route_step, _EPISODE: self._episode_step, _PANEL: self._panel_step}.get(step) or self._node_step(step)

        def timed(state: Mapping[str, Any]) -> dict[str, Any]:
            t0 = time.perf_counter()
            try:
                return fn(state)
            finally:
                self._timings[step] = self._timings.get(step, 0.0) + time.perf_counter() - t0

        return timed

    def _node_step(self, step: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
        node = self._nodes[step]

        def run(state: Mapping[str, Any]) -> dict[str, Any]:
            kwargs = {p: state[node.key_of(p)] for p in node.params if node.key_of(p) in state}
            missing = [p for p, req in node.params.items() if req and p not in kwargs]
            if missing:
                raise RuntimeError(f"node {node.name!r}: no value for parameter(s) {missing} at run time")
            if node.kind == "rollout":
                node.captured.clear()
            result = node.call(**kwargs)
            if node.kind == "rollout":
                return {node.name: self._rollout_result(node, result, len(state["prompts"]))}
            if len(node.outputs) == 1 and node.outputs == (node.name,):
                return {node.name: result}
            if not isinstance(result, Mapping) or set(result) != set(node.outputs):
                got = sorted(result) if isinstance(result, Mapping) else type(result).__name__
                raise RuntimeError(f"node {node.name!r} must return a mapping with keys {list(node.outputs)}, got {got}")
            return dict(result)

        return run

    def _rollout_result(self, node: _Node, result: Any, n: int) -> dict[str, Any]:
        if not isinstance(result, Mapping):
            raise RuntimeError(f"rollout node {node.name!r} must return a mapping (the rollout contract), got {type(result).__name__}")
        out = dict(result)
        if "trajectories" not in out and node.captured:
            out["trajectories"] = node.captured[-1]
        pending = getattr(node.call, "pending", None)
        if "trajectories" not in out and pending is not None and out.get("trajectory_ids"):
            # Under a trainer that scores rollouts later, create_rollout_fn holds its logs until the
            # rewards arrive instead of sinking them; read them there (without taking them).
            held = [pending.get(i) for i in out["trajectory_ids"]]
            if all(log is not None for log in held):
                out["trajectories"] = held
        out["trajectories"] = rollout_logs(node.name, out, n)
        return out

    def _route_step(self, state: Mapping[str, Any]) -> dict[str, Any]:
        router = self._router
        assert router is not None
        if self._router_takes_state:
            choice = router.call(state=dict(state))
        else:
            choice = router.call(**{p: state[router.key_of(p)] for p in router.params if router.key_of(p) in state})
        if isinstance(choice, int) and not isinstance(choice, bool) and 0 <= choice < len(self.rollout_nodes):
            choice = self.rollout_nodes[choice]
        if choice not in self.rollout_nodes:
            raise RuntimeError(f"router returned {choice!r}; expected one of the rollout nodes {self.rollout_nodes}")
        return {"route": choice}

    def _episode_step(self, state: Mapping[str, Any]) -> dict[str, Any]:
        from agenttune_lib.rl.rollout import split_prompt

        ran = [r for r in self._plan if r in self._nodes and self._nodes[r].kind == "rollout" and r in state]
        trainable = [r for r in ran if self._nodes[r].trainable]
        token_node = trainable[-1] if trainable else ran[-1]
        tasks = [split_prompt(p)[1] for p in state["prompts"]]
        extra = state.get("prompt_metadata") or [{} for _ in tasks]
        meta = [dict(self.task_metadata.get(t, {}), **dict(e or {})) for t, e in zip(tasks, extra)]
        if state.get("route"):
            meta = [dict(m, router_choice=state["route"]) for m in meta]
        runs = [(r, state[r]["trajectories"]) for r in ran]
        episodes = build_episodes(tasks, runs, token_node, meta)
        update = {"episodes": episodes, "token_agent": token_node}
        if self._router is None:
            update["route"] = None
        return update

    def _panel_step(self, state: Mapping[str, Any]) -> dict[str, Any]:
        judges = self.judge_nodes
        episodes = state["episodes"]
        if not judges:
            return {"trajectories": episodes, "judge_rewards": None, "judge_scores": None}
        scores = {j: list(state[j]) for j in judges}
        panel = aggregate_scores(scores, self.aggregate, self.weights)
        logs = with_judge_rewards(episodes, scores, panel, self.aggregate, self.weights if self.aggregate == "weighted" else None)
        per = [{j: scores[j][i] for j in judges} for i in range(len(episodes))]
        return {"trajectories": logs, "judge_rewards": panel, "judge_scores": per}

    def invoke(self, prompts: Sequence[Any], trainer: Any = None, prompt_metadata: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """Run the graph once over a batch of prompts; the final state (``trajectories``, ``judge_rewards``, each node's output).

        ``prompt_metadata`` (one mapping per prompt) is merged into each episode's metadata.
        """
        if not prompts:
            raise ValueError("AgentTuneGraph.invoke needs at least one prompt")
        if prompt_metadata is not None and len(prompt_metadata) != len(prompts):
            raise ValueError(f"prompt_metadata has {len(prompt_metadata)} entries for {len(prompts)} prompts")
        compiled = self._compiled or self.compile()
        self._timings = {}
        state = {"prompts": list(prompts), "trainer": trainer, "prompt_metadata": list(prompt_metadata) if prompt_metadata is not None else None}
        return compiled.invoke(state, {"recursion_limit": len(self._plan) + 10})

    # -- the three compiled callables ---------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The compiled wiring, as JSON-able data (for asset metadata and the CLI)."""
        wiring = self.wiring()
        return {
            "name": self.name,
            "plan": self.plan,
            "rollout_nodes": self.rollout_nodes,
            "judge_nodes": self.judge_nodes,
            "aggregate": self.aggregate,
            "weights": dict(self.weights),
            "router": self._router is not None,
            "wiring": json.loads(json.dumps(wiring)),
        }
