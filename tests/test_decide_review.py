"""Runs that wait for a person: a human_review parks its run (LangGraph interrupt + checkpointer, SQLite and
PostgreSQL), the batch moves on, and ``resume`` continues the run from its checkpoint with a decision that is
consumed once, names its reviewer and is recorded in the audit chain."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from _decide_helpers import schema_model
from agenttune_lib.decide import AuditReader, CollectRunner, DecideError, GraphRunner, verify_audit
from agenttune_lib.decide.review import pending_reviews, resume_decided

pytestmark = pytest.mark.usefixtures("platform_home")

HIGH_RISK = {"risk": {"risk_level": "high", "confidence": 0.7, "reason": "large unexplained income"}}


def _runner(tmp_path, checkpointer="default", **kw):
    return GraphRunner.from_template(
        "kyc_triage", model=schema_model(by_stage=HIGH_RISK), audit=tmp_path / "audit.jsonl",
        review_dir=tmp_path / "reviews", checkpointer=checkpointer, **kw,
    )


def _decide(tmp_path, review_id, **decision):
    (tmp_path / "reviews" / "decisions" / f"{review_id}.json").write_text(json.dumps(decision))


def _park_batch(tmp_path, checkpointer="default"):
    runner = _runner(tmp_path, checkpointer)
    examples = runner.config.examples[:3]  # adult (high risk -> review), minor (declined), sanctioned (review)
    started = time.perf_counter()
    result = CollectRunner(runner).collect(examples)
    elapsed = time.perf_counter() - started
    return runner, result, elapsed


def _check_park_and_resume(tmp_path, checkpointer):
    runner, result, elapsed = _park_batch(tmp_path, checkpointer)
    statuses = [s.status for s in result.states]
    assert statuses == ["suspended", "completed", "suspended"], statuses
    assert result.states[1].verdict["label"] == "decline"  # the row behind a pending review finished at once
    assert elapsed < 60  # nobody polled a day-long review timeout
    pending = {p["run_id"]: p for p in pending_reviews(tmp_path / "reviews")}
    parked = result.states[0]
    assert set(pending) == {parked.run_id, result.states[2].run_id}
    review_id = pending[parked.run_id]["review_id"]
    assert runner.waiting_review(parked.run_id)["review_id"] == review_id

    # A later process: a fresh runner over the same checkpointer continues from the checkpoint.
    _decide(tmp_path, review_id, decision="approved", reviewer="officer-17", comment="documents verified by phone")
    fresh = _runner(tmp_path, checkpointer)
    outcomes = resume_decided(tmp_path / "reviews", lambda template_id: fresh)
    done = {o.run_id: o for o in outcomes}
    assert done[parked.run_id].action == "resumed", done[parked.run_id].error
    state = done[parked.run_id].state
    assert state.status == "completed" and state.verdict["label"] == "approve"
    assert state.stage_outputs["review"]["reviewer"] == "officer-17"
    # stages before the review were not run again
    assert state.visits["extract"] == 1 and state.visits["review"] == 1
    assert done[result.states[2].run_id].action == "waiting", done[result.states[2].run_id].error

    # consumed once: the decision file is gone, a second resume does nothing, a re-sent decision is refused
    assert not (tmp_path / "reviews" / "decisions" / f"{review_id}.json").exists()
    assert (tmp_path / "reviews" / "decisions" / "consumed" / f"{review_id}.json").exists()
    with pytest.raises(DecideError, match="not waiting for a review"):
        fresh.resume(parked.run_id, {"decision": "denied", "reviewer": "someone"})
    _decide(tmp_path, review_id, decision="denied", reviewer="mallory")
    assert [o.run_id for o in resume_decided(tmp_path / "reviews", lambda t: fresh)] == [result.states[2].run_id]

    # recorded in the audit chain, reviewer named
    assert verify_audit(tmp_path / "audit.jsonl").ok
    records = AuditReader(tmp_path / "audit.jsonl").runs()[parked.run_id]
    review = [r for r in records["stages"] if r["stage_id"] == "review" and r["record_type"] == "stage"]
    assert any(r["record_type"] == "suspend" for r in records["stages"])  # the park is on the record too
    assert review and review[0]["output"]["reviewer"] == "officer-17" and review[0]["output"]["decision"] == "approved"
    assert records["run"]["label"] == "approve"
    return runner, result


def test_park_and_resume_on_sqlite(tmp_path):
    _check_park_and_resume(tmp_path, "default")
    assert (tmp_path / "reviews" / "checkpoints.sqlite").exists()


@pytest.mark.postgres
def test_park_and_resume_on_postgresql(tmp_path, pg_url):
    import psycopg

    schema = f"decide_ckpt_{uuid.uuid4().hex[:8]}"
    plain = pg_url.replace("postgresql+psycopg2://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as con:
        con.execute(f"CREATE SCHEMA {schema}")
    try:
        url = f"{pg_url}?options=-csearch_path%3D{schema}"
        _check_park_and_resume(tmp_path, url)
        with psycopg.connect(plain, autocommit=True) as con:
            threads = con.execute(f"SELECT count(DISTINCT thread_id) FROM {schema}.checkpoints").fetchone()[0]
        assert threads >= 2
    finally:
        with psycopg.connect(plain, autocommit=True) as con:
            con.execute(f"DROP SCHEMA {schema} CASCADE")


def test_deadline_passes_and_the_run_fails_closed(tmp_path):
    runner, result, _ = _park_batch(tmp_path)
    clock = {"now": time.time() + 86400 * 2}
    outcomes = resume_decided(tmp_path / "reviews", lambda t: runner, now=lambda: clock["now"])
    assert {o.action for o in outcomes} == {"timed_out"}
    for out in outcomes:
        assert out.state.verdict["label"] == "decline" and out.state.stage_outputs["review"]["decision"] == "timeout"
    assert pending_reviews(tmp_path / "reviews") == []


def test_stale_decision_never_approves_a_new_run(tmp_path):
    runner = _runner(tmp_path)
    example = runner.config.examples[0]
    first = runner.run(example, run_id="case-42")
    review_id = runner.waiting_review("case-42")["review_id"]
    # A run id is never reused: the old thread (and any decision for it) cannot carry over.
    with pytest.raises(DecideError, match="already used"):
        runner.run(example, run_id="case-42")
    # A decision written before a review opens is retired, not applied.
    _decide(tmp_path, "case-43-review-1", decision="approved", reviewer="officer-1")
    second = runner.run(example, run_id="case-43")
    assert second.status == "suspended"
    assert not (tmp_path / "reviews" / "decisions" / "case-43-review-1.json").exists()
    assert list((tmp_path / "reviews" / "decisions" / "stale").glob("case-43-review-1.*.json"))
    # A decision answering another review is refused.
    with pytest.raises(DecideError, match="stale decision"):
        runner.resume("case-43", {"decision": "approved", "reviewer": "x", "review_id": review_id})
    assert first.status == "suspended"


def test_decision_must_name_its_reviewer(tmp_path):
    runner = _runner(tmp_path)
    runner.run(runner.config.examples[0], run_id="case-7")
    review_id = runner.waiting_review("case-7")["review_id"]
    with pytest.raises(DecideError, match="names no reviewer"):
        runner.resume("case-7", {"decision": "approved"})
    _decide(tmp_path, review_id, decision="approved")
    out = resume_decided(tmp_path / "reviews", lambda t: runner)
    assert out[0].action == "error" and "reviewer" in out[0].error
    assert (tmp_path / "reviews" / "decisions" / f"{review_id}.json").exists()  # not consumed
    assert runner.waiting_review("case-7") is not None


@pytest.mark.parametrize("bad", ["../etc/passwd", "a/b", "..", "x" * 200, "", "a\\b", ".hidden"])
def test_run_id_cannot_escape_the_review_folder(tmp_path, bad):
    runner = _runner(tmp_path)
    with pytest.raises(DecideError, match="not allowed"):
        runner.run(runner.config.examples[0], run_id=bad)
    with pytest.raises(DecideError, match="not allowed"):
        runner.resume(bad, {"decision": "approved", "reviewer": "r"})


def test_cli_resume(tmp_path):
    from typer.testing import CliRunner

    from agenttune_lib.cli import app

    runner, result, _ = _park_batch(tmp_path)
    parked = result.states[0]
    review_id = runner.waiting_review(parked.run_id)["review_id"]
    _decide(tmp_path, review_id, decision="denied", reviewer="officer-3")
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({"risk": HIGH_RISK["risk"]}))
    args = ["decide", "resume", "--review-dir", str(tmp_path / "reviews"), "--replies", str(replies), "--audit", str(tmp_path / "audit.jsonl")]
    out = CliRunner().invoke(app, args + ["--run-id", parked.run_id])
    assert out.exit_code == 0, out.output
    line = json.loads(next(l for l in out.stdout.splitlines() if l.startswith("{")))
    assert line["action"] == "resumed" and line["verdict"]["label"] == "decline" and line["run_id"] == parked.run_id
    bad = CliRunner().invoke(app, args + ["--run-id", "../../x"])
    assert bad.exit_code == 1 and "not allowed" in bad.output


def test_pending_review_keeps_its_deadline_a_number(tmp_path):
    """The review file's timestamps are data the resumer computes with, not text the PII detectors may mask."""
    runner = _runner(tmp_path)
    runner.run(runner.config.examples[0], run_id="case-9")
    pending = pending_reviews(tmp_path / "reviews")[0]
    assert isinstance(pending["deadline"], float) and isinstance(pending["opened_at"], float)
    assert pending["deadline"] - pending["opened_at"] == pytest.approx(86400)
