"""AgentTuneGraph as TRL consumes it: a GRPO ``rollout_func``, one panel reward per completion, trajectory -> float."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.multi_agent.episode import PANEL_AUTHOR, message_events
from agenttune_lib.multi_agent.judges import aggregate_scores
from agenttune_lib.multi_agent.graph_nodes import GraphCompileError, _DatasetColumns, _episodes_from_completions


class GraphTrainerHooks:
    """Mixed into AgentTuneGraph: the callables a trainer takes, built from the compiled graph."""

    def compile_rollout(self) -> Callable[..., dict[str, Any]]:
        """A drop-in GRPO ``rollout_func(prompts, trainer)``: token rows from the trained agent, judge scores forwarded.

        Returns ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask`` (0 on environment
        tokens) and, forwarded by TRL to reward functions, ``judge_rewards``, ``judge_scores``,
        ``trajectory_ids``, ``agent``, ``responses``, ``agent_completions``, ``tool_call_counts``.
        """
        self._compiled or self.compile()
        columns = _DatasetColumns()

        def rollout_func(prompts: Sequence[Any], trainer: Any = None) -> dict[str, Any]:
            state = self.invoke(prompts, trainer, columns.lookup(trainer, prompts))
            token = state["token_agent"]
            rows = state[token]
            missing = [k for k in ("prompt_ids", "completion_ids", "logprobs") if k not in rows]
            if missing:
                raise RuntimeError(f"rollout node {token!r} supplies GRPO's token rows but returned no {missing}")
            logs: list[EventLog] = state["trajectories"]
            if self.sink is not None:
                self.sink(logs)
            n = len(prompts)
            out = {
                "prompt_ids": rows["prompt_ids"],
                "completion_ids": rows["completion_ids"],
                "logprobs": rows["logprobs"],
                "env_mask": rows.get("env_mask") or [[1] * len(c) for c in rows["completion_ids"]],
                "trajectory_ids": [log.id for log in logs],
                "agent": [token] * n,
            }
            for key in ("responses", "tool_call_counts"):
                if key in rows:
                    out[key] = rows[key]
            out["agent_completions"] = rows.get("agent_completions") or [
                [{"role": "assistant", "content": str(r)}] for r in rows.get("responses", [""] * n)
            ]
            if state.get("judge_rewards") is not None:
                out["judge_rewards"] = list(state["judge_rewards"])
                out["judge_scores"] = list(state["judge_scores"])
            self.history.append({"agent": token, "route": state.get("route"), "trajectory_ids": out["trajectory_ids"],
                                 "seconds": {k: round(v, 3) for k, v in self._timings.items()},
                                 "judge_scores": state.get("judge_scores") or [], "judge_rewards": state.get("judge_rewards") or []})
            return out

        rollout_func.graph = self  # type: ignore[attr-defined]
        return rollout_func

    def compile_grpo_reward(self) -> Callable[..., list[float]]:
        """A GRPO reward: one judge-panel score per completion.

        Under ``compile_rollout()`` it returns the forwarded ``judge_rewards``; given plain
        completions (TRL's own generation) it builds one episode per completion and runs the panel.
        """
        judges = self.judge_nodes
        if not judges:
            raise GraphCompileError("compile_grpo_reward() needs at least one judge node; add one with add_judge(name, judge)")

        def judge_panel(completions: Sequence[Any], prompts: Sequence[Any] | None = None, judge_rewards: Sequence[float] | None = None, **kwargs: Any) -> list[float]:
            log_metric = kwargs.get("log_metric")
            if judge_rewards is not None and all(r is not None for r in judge_rewards):
                if len(judge_rewards) != len(completions):
                    raise ValueError(f"judge_rewards has {len(judge_rewards)} values for {len(completions)} completions")
                per = kwargs.get("judge_scores")
                if callable(log_metric) and per:
                    for j in judges:
                        vals = [float(p[j]) for p in per if isinstance(p, Mapping) and j in p]
                        if vals:
                            log_metric(f"judge/{j}", sum(vals) / len(vals))
                return [float(r) for r in judge_rewards]
            logs = _episodes_from_completions(prompts, completions, self.task_metadata, kwargs.get("answer"))
            scores, panel = self._score(logs)
            if callable(log_metric):
                for j, vals in scores.items():
                    log_metric(f"judge/{j}", sum(vals) / len(vals))
            return panel

        judge_panel.__name__ = "judge_panel"
        return judge_panel

    def compile_reward(self) -> Callable[[Any], float]:
        """A plain scorer: one trajectory (EventLog, its dict, or text) -> the judge panel's aggregate score."""
        if not self.judge_nodes:
            raise GraphCompileError("compile_reward() needs at least one judge node; add one with add_judge(name, judge)")

        def reward(trajectory: Any) -> float:
            if isinstance(trajectory, EventLog):
                log = trajectory
            elif isinstance(trajectory, Mapping):
                log = EventLog.from_dict(trajectory)
            elif isinstance(trajectory, str):
                log = EventLog([Event(EventKind.TEXT, {"content": trajectory})])
            elif isinstance(trajectory, Sequence) and trajectory and all(isinstance(m, Mapping) for m in trajectory):
                log = EventLog(message_events(trajectory))
            else:
                raise TypeError(f"compile_reward(): a trajectory must be an EventLog, its dict, chat messages or text, got {type(trajectory).__name__}")
            return self._score([log])[1][0]

        return reward

    def _score(self, logs: Sequence[EventLog]) -> tuple[dict[str, list[float]], list[float]]:
        scores = {j: self._nodes[j].judge.score(logs) for j in self.judge_nodes}  # type: ignore[union-attr]
        return scores, aggregate_scores(scores, self.aggregate, self.weights)

    def judge_distributions(self) -> dict[str, list[float]]:
        """Every judge's scores (and the panel's) across all batches this graph rolled out."""
        out: dict[str, list[float]] = {j: [] for j in self.judge_nodes}
        out[PANEL_AUTHOR] = []
        for h in self.history:
            for per in h["judge_scores"]:
                for j, v in per.items():
                    out.setdefault(j, []).append(float(v))
            out[PANEL_AUTHOR].extend(float(v) for v in h["judge_rewards"])
        return out
