"""Errors in the OpenAI shape (``{"error": {"message", "type", "param", "code"}}``) with the right 4xx status."""
from __future__ import annotations

from typing import Any

__all__ = ["APIError", "error_body"]


class APIError(Exception):
    """A request the service refuses; ``status`` is the HTTP status, ``code`` a stable machine-readable reason."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = status, message, code, param, type


def error_body(message: str, code: str, param: str | None = None, type: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
