"""Multi-agent orchestration (paper §3.10): AgentTuneGraph composes rollout and judge nodes into one LangGraph.

Exports resolve lazily so importing this package loads no torch, TRL or LangGraph.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AgentTuneGraph": "graph",
    "GraphCompileError": "graph",
    "GRAPH_INPUTS": "graph",
    "BUILTIN_KEYS": "graph",
    "AGGREGATES": "judges",
    "JudgeAdapter": "judges",
    "JudgeNodeError": "judges",
    "RewardJudge": "judges",
    "OverlapJudge": "judges",
    "AnswerJudge": "judges",
    "answer_score": "judges",
    "aggregate_scores": "judges",
    "PANEL_AUTHOR": "episode",
    "build_episodes": "episode",
    "GraphSpec": "spec",
    "load_graph_spec": "spec",
    "default_spec_path": "spec",
    "build_graph": "spec",
    "RoundRobinRouter": "spec",
    "MultiAgentResult": "train",
    "train_multi_agent": "train",
    "attribution": "train",
    "attribution_problems": "train",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f"agenttune_lib.multi_agent.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'agenttune_lib.multi_agent' has no attribute {name!r}")
