"""The OpenAI-compatible service over the deployed agent (paper §3.12's [service] extra): FastAPI app, batching engine,
traffic recording into the warehouse, feedback into the closed loop, and the operator page."""
from agenttune_lib.service.config import ServiceConfig

__all__ = ["ServiceConfig", "create_app"]


def create_app(config: ServiceConfig, **kwargs):
    """The FastAPI app (imported lazily: FastAPI is an optional extra)."""
    from agenttune_lib.service.app import create_app as _create

    return _create(config, **kwargs)
