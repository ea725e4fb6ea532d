"""Input tables for DECIDE runs: JSON lines, a JSON list or object, CSV, Parquet, or plain text."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from agenttune_lib.decide.errors import DecideError

__all__ = ["read_inputs"]


def read_inputs(path: str | Path, limit: int | None = None) -> list[Any]:
    """Rows to run: one mapping (or string) per run; a bad file raises DecideError naming it and the line."""
    path = Path(path)
    if not path.is_file():
        raise DecideError(f"input file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    rows: list[Any]
    if suffix == ".jsonl":
        rows = []
        # Split on "\n" only: str.splitlines() also breaks at U+2028/U+2029/\x1c…, legal inside a JSON string.
        for lineno, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
            line = line.rstrip("\r")
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise DecideError(f"input file {str(path)!r} line {lineno} is not JSON: {exc}") from None
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise DecideError(f"input file {str(path)!r} is not JSON: {exc}") from None
        rows = data if isinstance(data, list) else [data]
    elif suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as handle:
            rows = [_coerce_csv(r) for r in csv.DictReader(handle)]
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    else:
        rows = [path.read_text(encoding="utf-8")]
    for i, row in enumerate(rows):
        if not isinstance(row, (dict, str)):
            raise DecideError(f"input file {str(path)!r} row {i} must be an object or a string, got {type(row).__name__}")
    return rows[:limit] if limit is not None else rows


def _coerce_csv(row: dict[str, str]) -> dict[str, Any]:
    """CSV cells that parse as JSON numbers, booleans or lists become those values."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        try:
            parsed = json.loads(value)
            out[key] = parsed if isinstance(parsed, (int, float, bool, list, dict)) else value
        except (TypeError, ValueError):
            out[key] = value
    return out


def read_labelled_inputs(path: str | Path, limit: int | None = None) -> list[tuple[Any, tuple[str, ...] | None]]:
    """``(row without its expected_label, accepted labels or None)`` per row of an input file: the label goes to the
    run's audit line, never to a stage. A malformed label raises DecideError naming the file and the row."""
    from agenttune_lib.decide.config import split_expected_rows

    try:
        return split_expected_rows(read_inputs(path, limit=limit), f"input file {str(path)!r}")
    except ValueError as exc:
        raise DecideError(str(exc)) from None
