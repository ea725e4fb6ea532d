"""TemplateRegistry: the templates of one directory, indexed by identifier."""
from __future__ import annotations

from pathlib import Path

from agenttune_lib.decide.config import ConfigLoader, TemplateConfig, validate_identifier
from agenttune_lib.decide.errors import TemplateError

__all__ = ["TemplateRegistry"]


class TemplateRegistry:
    """Index of ``decide_templates/`` (or any directory); a bare name (``kyc_triage``) resolves when unique."""

    def __init__(self, templates_dir: str | Path | None = None) -> None:
        self.loader = ConfigLoader(templates_dir)
        self._cache: dict[str, TemplateConfig] = {}

    @property
    def templates_dir(self) -> Path:
        return self.loader.templates_dir

    def ids(self) -> list[str]:
        return self.loader.identifiers()

    list_templates = ids

    def __iter__(self):
        return iter(self.ids())

    def __contains__(self, identifier: object) -> bool:
        try:
            self.resolve_id(identifier)  # type: ignore[arg-type]
        except TemplateError:
            return False
        return True

    def __len__(self) -> int:
        return len(self.ids())

    def resolve_id(self, identifier: str) -> str:
        """The full identifier for ``identifier`` (``kyc_triage`` → ``bfsi/kyc_triage``)."""
        ident = validate_identifier(identifier)
        ids = self.ids()
        if ident in ids:
            return ident
        matches = [i for i in ids if i.split("/")[-1] == ident]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise TemplateError(f"template name {identifier!r} is ambiguous: {matches}")
        raise TemplateError(f"no template {identifier!r} in {str(self.templates_dir)!r}; known: {ids}")

    def get(self, identifier: str) -> TemplateConfig:
        """The validated TemplateConfig (cached)."""
        ident = self.resolve_id(identifier)
        if ident not in self._cache:
            self._cache[ident] = self.loader.load(ident)
        return self._cache[ident]

    load = get

    def validate_all(self) -> dict[str, str | None]:
        """Identifier → None when it loads, or the error message."""
        out: dict[str, str | None] = {}
        for ident in self.ids():
            try:
                self.loader.load(ident)
                out[ident] = None
            except TemplateError as exc:
                out[ident] = str(exc)
        return out
