"""Stage 1: detector (durable offset), classifier (rules + injected LLM), generator (replay-validated), ClosedLoop."""
from __future__ import annotations

import json

import pytest

from _closed_loop_helpers import write_kyc_audit
from agenttune_lib.closed_loop import ClosedLoop, FailureClassifier, FailureDetector, TrainingBuffer
from agenttune_lib.closed_loop.detector import audit_reader_name
from agenttune_lib.closed_loop.types import Failure, Run
from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse import Warehouse


@pytest.fixture
def wh(tmp_path):
    return Warehouse(tmp_path / "wh.duckdb")


def test_detector_reads_decide_audit_and_flags_loops_and_crashes(tmp_path):
    path = write_kyc_audit(tmp_path / "audit.jsonl", n_loops=6, n_ok=4, crash=2)
    read = FailureDetector().read_audit(path)
    assert len(read.runs) == 12 and read.end_offset == path.stat().st_size
    loops = [f for f in read.failures if "loop_collapse" in f.signals]
    crashes = [f for f in read.failures if "tool_crash" in f.signals]
    assert len(loops) == 6 and len(crashes) == 2
    assert loops[0].evidence["loop_stage"] in ("route", "request_documents") and loops[0].evidence["visits"] == 5
    assert crashes[0].evidence["errors"][0]["error"]["type"] == "invalid_arguments"
    assert len(read.successes) == 4


def test_detector_never_passes_a_half_written_run(tmp_path):
    path = write_kyc_audit(tmp_path / "audit.jsonl", n_loops=1, n_ok=1)
    lines = path.read_bytes().splitlines(keepends=True)
    cut = tmp_path / "partial.jsonl"
    cut.write_bytes(b"".join(lines[:7]) + lines[7][:10])  # first run complete (5 lines), second open, last line torn
    read = FailureDetector().read_audit(cut)
    assert [r.trajectory_id for r in read.runs] == ["ok-0"]
    assert read.end_offset == sum(len(x) for x in lines[:5])
    cut.write_bytes(b"".join(lines))
    rest = FailureDetector().read_audit(cut, read.end_offset)
    assert [r.trajectory_id for r in rest.runs] == ["loop-0"] and rest.end_offset == len(b"".join(lines))


def test_detector_rejects_a_corrupt_line_and_a_truncated_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"record_type": "stage"}\nnot json\n')
    with pytest.raises(ValueError, match="byte 25 is not JSON"):
        FailureDetector().read_audit(bad)
    with pytest.raises(ValueError, match="past its end"):
        FailureDetector().read_audit(bad, 10_000)


def test_detector_over_eventlogs_judge_and_tool_error():
    ok = EventLog([Event(EventKind.TOOL_CALL, {"name": "search", "arguments": {"q": "a"}}), Event(EventKind.TOOL_RESULT, {"name": "search", "content": "x"}),
                   Event(EventKind.REWARD, {"value": 0.9}, scope="episode")], metadata={"task": "t"})
    low = EventLog([Event(EventKind.TEXT, {"content": "guess"}), Event(EventKind.REWARD, {"value": 0.1}, scope="episode")], metadata={"task": "t"})
    crash = EventLog([Event(EventKind.TOOL_CALL, {"name": "search", "arguments": {}}),
                      Event(EventKind.TOOL_RESULT, {"name": "search", "error": {"type": "unknown_tool"}})])
    texty = EventLog([Event(EventKind.TOOL_CALL, {"name": "search", "arguments": {}}),
                      Event(EventKind.TOOL_RESULT, {"name": "search", "content": "error: the word error in text is not a crash"})])
    fails = {f.trajectory_id: f for f in FailureDetector().detect_logs([ok, low, crash, texty])}
    assert set(fails) == {low.id, crash.id}
    assert fails[low.id].signals == ["judge_below_threshold"] and fails[crash.id].signals == ["tool_crash"]
    assert FailureClassifier().classify(fails[crash.id]).root_cause == "wrong_tool"


def _failure(signals, evidence, records=()):
    return Failure("f1", Run("t1", list(records), input="in", output={"label": "x"}), list(signals), dict(evidence))


def test_classifier_rules_and_injected_llm():
    clf = FailureClassifier()
    assert clf.classify(_failure(["loop_collapse"], {"loop_stage": "route", "visits": 5, "revisit_limit": 3})).root_cause == "loop_collapse"
    schema_err = _failure(["stage_error"], {"errors": [{"stage": "assess", "kind": "text", "error": {"type": "schema_validation"}}]})
    assert clf.classify(schema_err).root_cause == "hallucinated_output"
    routed = _failure(["judge_below_threshold"], {"judge_score": 0.2}, [{"stage": "route", "state": {"route": "reject", "expected_route": "assess"}}])
    assert clf.classify(routed).root_cause == "wrong_routing"
    vague = _failure(["judge_below_threshold"], {"judge_score": 0.2})
    assert clf.classify(vague) is None  # the evidence does not decide it and no LLM is injected
    prompts = []

    def llm(prompt):
        prompts.append(prompt)
        return 'Sure: {"root_cause": "incomplete_reasoning", "reason": "skipped the income check"}'

    got = FailureClassifier(llm=llm).classify(vague)
    assert got.root_cause == "incomplete_reasoning" and got.method == "llm" and "judge_score" in prompts[0]
    assert FailureClassifier(llm=lambda p: "no idea").classify(vague) is None
    assert FailureClassifier.parse("it is hallucinated_output, clearly") [0] == "hallucinated_output"


def test_closed_loop_buffers_replay_validated_examples_and_commits_offset(tmp_path, wh):
    path = write_kyc_audit(tmp_path / "audit.jsonl", n_loops=6, n_ok=9)
    buf = TrainingBuffer(wh)
    rep = ClosedLoop(buf).ingest_audit(path)
    assert rep.runs == 15 and rep.failures == 6 and rep.signals == {"loop_collapse": 6}
    assert rep.buffered == 6 and rep.accepted == 6
    st = buf.stats()
    assert st.counts == {"loop_collapse": 6} and st.accepted == 6
    assert buf.offset(audit_reader_name(path)) == path.stat().st_size
    ex = buf.examples()[0]
    assert json.loads(ex.chosen)["label"] in ("approve", "reject", "escalate")
    assert "request_documents" in ex.rejected and ex.validation.startswith("replay passed")
    assert ex.as_dpo_row()["prompt"][0]["content"].startswith("KYC application")
    # a restarted process reads nothing twice; new lines are read once
    again = ClosedLoop(TrainingBuffer(Warehouse(wh.path))).ingest_audit(path)
    assert again.runs == 0 and buf.stats().size == 6
    write_kyc_audit(path, n_loops=2, n_ok=0)  # appended runs reuse ids loop-0/1 -> same failure ids -> ledger dedups
    third = ClosedLoop(TrainingBuffer(Warehouse(wh.path))).ingest_audit(path)
    assert third.runs == 2 and third.buffered == 0 and buf.stats().size == 6


def test_unvalidated_corrections_are_kept_out_of_training(tmp_path, wh):
    path = write_kyc_audit(tmp_path / "audit.jsonl", n_loops=3, n_ok=0)  # no successful run to correct from
    buf = TrainingBuffer(wh)
    rep = ClosedLoop(buf).ingest_audit(path)
    assert rep.buffered == 0 and rep.dropped == 3
    st = buf.stats()
    assert st.attempts == 3 and st.dropped == 3 and st.size == 0
