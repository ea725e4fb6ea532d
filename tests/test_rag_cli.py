"""``agenttune rag``: synthesize, search, metrics and qa on a small real corpus; bad input exits with a message."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agenttune_lib.cli import app
from _rag_helpers import SMALL_KEYS

runner = CliRunner()


@pytest.mark.slow
def test_synthesize_search_metrics_and_qa(platform_home):
    keys = [a for k in SMALL_KEYS[:8] for a in ("--key", k)]
    res = runner.invoke(app, ["rag", "synthesize", *keys, "--max-candidates", "400"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["funnel"]["gated"] > 0 and set(summary["retrieval"]) == {"bm25", "dense", "hybrid"}
    res = runner.invoke(app, ["rag", "search", "WinRAR evaluation copy", "--backend", "bm25", "-k", "3"])
    assert res.exit_code == 0 and "ch-" in res.output
    res = runner.invoke(app, ["rag", "metrics", "--split", "all", "-k", "8"])
    assert res.exit_code == 0 and "R@8" in res.output
    res = runner.invoke(app, ["rag", "qa", "validation", "--limit", "2"])
    assert res.exit_code == 0 and "items in validation" in res.output


def test_bad_input_exits_with_a_clear_message(platform_home, tmp_path):
    empty = tmp_path / "docs"
    empty.mkdir()
    (empty / "blank.txt").write_text("   ")
    res = runner.invoke(app, ["rag", "index", "--category", "", "--folder", str(empty)])
    assert res.exit_code == 2 and "blank.txt" in res.output
    res = runner.invoke(app, ["rag", "search", "anything"])
    assert res.exit_code == 2 and "no chunk index" in res.output
    res = runner.invoke(app, ["rag", "qa", "train"])
    assert res.exit_code == 2 and "qa_items" in res.output
