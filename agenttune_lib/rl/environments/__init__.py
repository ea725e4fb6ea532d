"""RL environments (TEAM contract 5): τ² retail, QA search over the real index, BFCL-style single calls."""
from agenttune_lib.rl.environments.base import (
    ENVIRONMENTS,
    Environment,
    environment_factories,
    environment_rows,
    make_environment,
    register_environment,
)
from agenttune_lib.rl.environments.qa_search import QASearchEnvironment, qa_search_tasks
from agenttune_lib.rl.environments.tau2 import Tau2Environment, tau2_tasks
from agenttune_lib.rl.environments.tool_call import ToolCallEnvironment, call_match, tool_call_tasks

__all__ = [
    "ENVIRONMENTS", "Environment", "environment_factories", "environment_rows", "make_environment", "register_environment",
    "QASearchEnvironment", "qa_search_tasks", "Tau2Environment", "tau2_tasks", "ToolCallEnvironment", "tool_call_tasks", "call_match",
]
