"""Agent memory: in-context, vector and graph backends behind BaseMemory, plus the warehouse-backed TrajectoryStore."""
from agenttune_lib.spine.memory.base import BaseMemory, MemoryItem, Scope
from agenttune_lib.spine.memory.graph import GraphMemory
from agenttune_lib.spine.memory.in_context import InContextMemory
from agenttune_lib.spine.memory.trajectory_store import TrajectoryStore
from agenttune_lib.spine.memory.vector import VectorMemory

__all__ = ["BaseMemory", "MemoryItem", "Scope", "InContextMemory", "VectorMemory", "GraphMemory", "TrajectoryStore"]
