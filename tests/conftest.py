"""Shared fixtures: an isolated platform home per test, tiny models, the PostgreSQL server."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Property tests check behaviour, not speed: a per-example deadline fails them on a loaded 2-core machine.
settings.register_profile("agenttune", deadline=None)
settings.load_profile("agenttune")

PG_URL = os.environ.get("AGENTTUNE_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")


@pytest.fixture
def platform_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``$AGENTTUNE_HOME`` (warehouse, models, artifacts) for one test."""
    home = tmp_path / "agenttune_home"
    home.mkdir()
    monkeypatch.setenv("AGENTTUNE_HOME", str(home))
    return home


@pytest.fixture
def warehouse(tmp_path: Path):
    from agenttune_lib.warehouse import Warehouse

    return Warehouse(tmp_path / "warehouse.duckdb")


@pytest.fixture(scope="session")
def tiny_model():
    """(model, tokenizer): a random-init tiny Qwen2 with a locally trained tokenizer."""
    from agenttune_lib.models.tiny import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from agenttune_lib.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def _pg_reachable(url: str) -> str | None:
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url)
        with engine.connect() as con:
            con.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as exc:  # report why, below
        return str(exc).splitlines()[0]


@pytest.fixture(scope="session")
def pg_url() -> str:
    """The real PostgreSQL server; fails (not skips) when AGENTTUNE_PG_REQUIRED=1 and it is unreachable."""
    problem = _pg_reachable(PG_URL)
    if problem:
        message = f"PostgreSQL at {PG_URL} is not reachable: {problem}"
        if os.environ.get("AGENTTUNE_PG_REQUIRED") == "1" or os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return PG_URL
