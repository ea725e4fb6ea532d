"""Running the app under uvicorn, with the startup lines that say what is served and whether auth is on."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agenttune_lib.service.config import ServiceConfig

__all__ = ["startup_lines", "serve", "build_server"]


def startup_lines(config: ServiceConfig, served_adapter_id: str) -> list[str]:
    """What ``agenttune serve`` prints before it listens."""
    auth = ("API key required (Authorization: Bearer <key>)" if config.auth_enabled
            else f"NO API key: auth is off because the service is bound to loopback ({config.host}) only")
    return [
        f"agenttune serve: http://{config.host}:{config.port}/v1 (OpenAI chat completions), operator page /operator",
        f"auth: {auth}",
        f"model: 'deployed' follows {config.deploy_root / 'DEPLOYED.json'} per request; serving {served_adapter_id} now (base {config.base_path})",
        f"engine: {config.engine}, batching up to {config.max_batch} concurrent requests; limits: body {config.max_body_bytes} B, "
        f"prompt {config.max_prompt_tokens} tokens, completion {config.max_completion_tokens} tokens",
        f"traffic: every request -> full-tier EventLog in {config.warehouse_path} (PII {'redacted' if config.redact else 'NOT redacted'})",
    ]


def build_server(config: ServiceConfig, app: Any = None, **app_kwargs: Any) -> Any:
    """A ``uvicorn.Server`` for the app (tests run it in a thread; ``serve`` runs it in the foreground)."""
    import uvicorn

    from agenttune_lib.service.app import create_app

    app = app if app is not None else create_app(config, **app_kwargs)
    return uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", access_log=False))


def serve(config: ServiceConfig, echo: Callable[[str], None] = print) -> None:
    """Build the app (fails fast on a bad pointer or engine), print the startup lines, then serve until interrupted."""
    from agenttune_lib.service.app import create_app

    app = create_app(config)
    served = app.state.service.registry.deployed()
    for line in startup_lines(config, served.served_adapter_id):
        echo(line)
    build_server(config, app).run()
