"""LangGraph checkpointers for suspendable DECIDE runs: SQLite by default, PostgreSQL in production.

A run whose ``human_review`` stage waits for a person is parked in the checkpointer (LangGraph ``interrupt()``)
and resumed later, possibly by another process, from exactly that point.
"""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

from agenttune_lib.decide.errors import DecideError

__all__ = ["make_checkpointer", "validate_run_id", "RUN_ID_PATTERN"]

#: Run ids name files (pending reviews, decisions) and checkpoint threads: no separators, no "..".
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def validate_run_id(run_id: Any) -> str:
    """``run_id`` if it is a safe name (letters, digits, ``_ . -``; no path separator, no ``..``); else an error."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id) or ".." in run_id:
        raise DecideError(f"run id {run_id!r} is not allowed: use 1-128 letters, digits, '_', '.' or '-' (no path separators, no '..')")
    return run_id


def _serde() -> Any:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    return JsonPlusSerializer(allowed_msgpack_modules=[("agenttune_lib.decide.state", "PipelineState")])


def make_checkpointer(spec: Any) -> Any:
    """A LangGraph checkpointer from a saver object, a SQLite path (``sqlite:///…`` or a file path), or a PostgreSQL
    URL (``postgresql://…``; a SQLAlchemy ``postgresql+psycopg2://`` URL is accepted and used with psycopg 3)."""
    if spec is None:
        raise DecideError("no checkpointer given")
    if hasattr(spec, "get_tuple") and hasattr(spec, "put"):
        return spec
    text = str(spec)
    if text.startswith(("postgresql://", "postgres://", "postgresql+psycopg2://", "postgresql+psycopg://")):
        return _postgres(re.sub(r"^postgres(ql)?(\+psycopg2?)?://", "postgresql://", text))
    path = Path(text[len("sqlite:///"):] if text.startswith("sqlite:///") else text)
    path.parent.mkdir(parents=True, exist_ok=True)
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    saver = SqliteSaver(conn, serde=_serde())
    saver.setup()
    return saver


def _postgres(url: str) -> Any:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    try:
        conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    except psycopg.Error as exc:
        raise DecideError(f"cannot reach the PostgreSQL checkpointer at {re.sub(r'//[^@/]*@', '//***@', url)}: {exc}") from None
    saver = PostgresSaver(conn, serde=_serde())
    saver.setup()
    return saver
