"""The agentic spine: strategies, harnesses and conformance, memory, the episode drivers and the Project lifecycle."""
from agenttune_lib.spine.conformance import ConformanceReport, run_conformance
from agenttune_lib.spine.episode import episode_succeeded, run_episode, run_reflexion
from agenttune_lib.spine.harness import DictToolHarness, Harness, HarnessCapabilities
from agenttune_lib.spine.openenv import OpenEnvHarness
from agenttune_lib.spine.preferences import preference_pairs
from agenttune_lib.spine.state import Action, AgentState, Generation, StepResult
from agenttune_lib.spine.strategies import (
    AgentStrategy,
    MemoryReActStrategy,
    PlanExecuteStrategy,
    ReActStrategy,
    ReflexionStrategy,
    TreeOfThoughtsStrategy,
)
from agenttune_lib.spine.tau2 import Tau2RetailHarness, Tau2Task, load_tau2_tasks

__all__ = [
    "Action",
    "AgentState",
    "AgentStrategy",
    "ConformanceReport",
    "DictToolHarness",
    "Generation",
    "Harness",
    "HarnessCapabilities",
    "MemoryReActStrategy",
    "OpenEnvHarness",
    "PlanExecuteStrategy",
    "ReActStrategy",
    "ReflexionStrategy",
    "StepResult",
    "Tau2RetailHarness",
    "Tau2Task",
    "TreeOfThoughtsStrategy",
    "episode_succeeded",
    "load_tau2_tasks",
    "preference_pairs",
    "run_conformance",
    "run_episode",
    "run_reflexion",
]


def __getattr__(name: str):
    if name in ("Project", "LifecycleEvent"):
        from agenttune_lib.spine import project

        return getattr(project, name)
    raise AttributeError(name)
