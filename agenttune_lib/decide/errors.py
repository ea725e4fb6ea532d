"""DECIDE errors: every message names the template and, where there is one, the stage."""
from __future__ import annotations

__all__ = ["DecideError", "TemplateError", "StageError", "RuleError", "AuditError"]


def _where(template: str | None, stage: str | None) -> str:
    parts = []
    if template:
        parts.append(f"template {template!r}")
    if stage:
        parts.append(f"stage {stage!r}")
    return ", ".join(parts)


class DecideError(Exception):
    """Base class; ``template`` and ``stage`` name where the problem is."""

    def __init__(self, message: str, template: str | None = None, stage: str | None = None, detail: object = None) -> None:
        self.template = template
        self.stage = stage
        self.detail = detail
        self.bare_message = message
        where = _where(template, stage)
        super().__init__(f"{where}: {message}" if where else message)


class TemplateError(DecideError):
    """A template that cannot be loaded or compiled (syntax, schema, graph shape, identifier)."""


class StageError(DecideError):
    """A stage that failed while running (invalid model reply, tool timeout, failed lookup)."""


class RuleError(DecideError):
    """A rule condition that is not in the allowed grammar, or that cannot be evaluated."""


class AuditError(DecideError):
    """An audit log that cannot be read or written."""
