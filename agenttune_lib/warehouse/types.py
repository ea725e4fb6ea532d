"""The warehouse's shared records: a trajectory's Provenance, the WarehouseError, and SQL identifier checks."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

__all__ = ["Provenance", "WarehouseError"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where a trajectory came from: the Dagster run and asset, the model, and the data it used."""

    run_id: str | None = None
    asset_key: str | None = None
    partition: str | None = None
    model_version: str | None = None
    adapter_version: str | None = None
    qa_item_ids: tuple[str, ...] = ()
    chunk_ids: tuple[str, ...] = ()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    teacher_kind: str | None = None
    teacher_version: str | None = None


class WarehouseError(RuntimeError):
    """A warehouse operation failed; the message names the table, id or file."""


def _ident(name: str) -> str:
    if not _IDENT.match(name):
        raise WarehouseError(f"invalid table or column name {name!r}")
    return name
