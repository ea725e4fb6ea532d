"""AgentTune library: the EventLog contract and every lifecycle stage built on it (no Dagster here)."""
from agenttune_lib.events import Event, EventKind, EventLog

__all__ = ["Event", "EventKind", "EventLog"]
__version__ = "0.1.0"
