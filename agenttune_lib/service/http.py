"""ASGI pieces: the request-body limit and the API-key check, both answering in the OpenAI error shape."""
from __future__ import annotations

import hmac
import json
from typing import Any

from agenttune_lib.service.errors import error_body

__all__ = ["BodyLimit", "ApiKeyAuth"]


async def _send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


class _TooLarge(Exception):
    pass


class BodyLimit:
    """Refuses a request body over ``limit`` bytes with 413, by its Content-Length or while it is being read."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        message = f"request body exceeds this service's limit of {self.limit} bytes"
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _send_json(send, 413, error_body(message, "request_too_large"))
        total = 0
        started = False

        async def limited() -> Any:
            nonlocal total
            msg = await receive()
            if msg.get("type") == "http.request":
                total += len(msg.get("body") or b"")
                if total > self.limit:
                    raise _TooLarge()
            return msg

        async def tracking_send(msg: Any) -> None:
            nonlocal started
            if msg.get("type") == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited, tracking_send)
        except _TooLarge:
            if not started:
                await _send_json(send, 413, error_body(message, "request_too_large"))


class ApiKeyAuth:
    """Requires ``Authorization: Bearer <key>`` (or ``X-API-Key``; ``?key=`` for the operator page) on /v1 and /operator."""

    def __init__(self, app: Any, api_key: str | None) -> None:
        self.app, self.api_key = app, api_key

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or self.api_key is None or not (path.startswith("/v1") or path.startswith("/operator")):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"").decode("latin-1")
        token = given[7:].strip() if given.lower().startswith("bearer ") else headers.get(b"x-api-key", b"").decode("latin-1")
        if not token and path.startswith("/operator"):
            from urllib.parse import parse_qs

            token = (parse_qs(scope.get("query_string", b"").decode()).get("key") or [""])[0]
        if not token or not hmac.compare_digest(token.encode(), self.api_key.encode()):
            return await _send_json(send, 401, error_body("missing or wrong API key (send Authorization: Bearer <key>)",
                                                          "invalid_api_key", type="authentication_error"))
        return await self.app(scope, receive, send)
