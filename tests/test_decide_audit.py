"""The audit trail: the keyed (HMAC) chain and its head checkpoint catch edits, insertions, reorderings and deletions; personal data is redacted."""
import json

import pytest

from _decide_helpers import schema_model
from agenttune_lib.decide import AuditError, AuditReader, AuditWriter, CollectRunner, GraphRunner, Redactor, verify_audit
from agenttune_lib.decide.audit import GENESIS_HASH, FileHeadStore, WarehouseHeadStore, load_audit_key, record_hash, record_mac

pytestmark = pytest.mark.usefixtures("platform_home")

KYC_APPLICANT = {
    "applicant_id": "A-77", "name": "Margarethe Vestergaard", "date_of_birth": "1979-03-14", "age": 46,
    "nationality": "DK", "employer": "Nordlys Shipping ApS", "annual_income": 612345,
    "documents": ["passport", "proof_of_address"], "source_of_funds": "salary",
}
PERSONAL = ["Margarethe Vestergaard", "1979-03-14", "Nordlys Shipping ApS", "612345"]


def filled_log(tmp_path, runs=3):
    path = tmp_path / "audit.jsonl"
    runner = GraphRunner.from_template("kyc_triage", model=schema_model(), audit=path, review_dir=tmp_path, human_review_timeout=0.0)
    for i in range(runs):
        runner.run({**KYC_APPLICANT, "applicant_id": f"A-{i}"})
    return path


def test_chain_links_every_line(tmp_path):
    path = filled_log(tmp_path, runs=2)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["prev_hash"] == GENESIS_HASH
    for i, rec in enumerate(lines):
        assert rec["seq"] == i and rec["hash"] == record_mac(rec, load_audit_key()) != record_hash(rec)
        if i:
            assert rec["prev_hash"] == lines[i - 1]["hash"]
    result = verify_audit(path)
    assert result.ok and result.count == len(lines) and not result.warnings


def _rewrite(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


@pytest.mark.parametrize(
    "tamper",
    ["edit_output", "edit_verdict", "delete_middle", "delete_last", "insert", "swap", "truncate_garbage",
     "unkeyed_chain", "truncate_and_drop_head", "emptied", "emptied_and_drop_head", "deleted_head", "wrong_key"],
)
def test_keyed_chain_catches_a_tampered_log(tmp_path, tamper, monkeypatch):
    path = filled_log(tmp_path)
    lines = path.read_text().splitlines()
    heads = FileHeadStore()
    if tamper == "edit_output":
        rec = json.loads(lines[2])
        rec["output"] = {"tampered": True}
        lines[2] = json.dumps(rec, sort_keys=True)
        expect = "line 3: HMAC mismatch"
    elif tamper == "edit_verdict":
        idx = next(i for i, l in enumerate(lines) if json.loads(l)["record_type"] == "run")
        rec = json.loads(lines[idx])
        rec["verdict"]["label"] = "approve" if rec["verdict"]["label"] != "approve" else "decline"
        rec["hash"] = record_hash(rec)  # a recomputed plain SHA-256 is not the keyed MAC
        lines[idx] = json.dumps(rec, sort_keys=True)
        expect = f"line {idx + 1}: HMAC mismatch"
    elif tamper == "delete_middle":
        del lines[4]
        expect = "line 5: seq is 5, expected 4"
    elif tamper == "delete_last":
        lines = lines[:-1]
        expect = "head checkpoint records"
    elif tamper == "insert":
        fake = dict(json.loads(lines[1]), stage_id="forged")
        fake["hash"] = record_hash(fake)
        lines.insert(2, json.dumps(fake, sort_keys=True))
        expect = "line 3"
    elif tamper == "swap":
        lines[3], lines[4] = lines[4], lines[3]
        expect = "line 4"
    elif tamper == "truncate_garbage":
        lines.append("{not json")
        expect = "not JSON"
    elif tamper == "unkeyed_chain":
        # The attacker rewrites one verdict and recomputes the whole chain, links included, without the key.
        prev, out = GENESIS_HASH, []
        for line in lines:
            rec = json.loads(line)
            if rec["record_type"] == "run":
                rec["label"] = "approve"
            rec["prev_hash"] = prev
            rec["hash"] = prev = record_hash(rec)
            out.append(json.dumps(rec, sort_keys=True))
        lines = out
        expect = "line 1: HMAC mismatch"
    elif tamper == "truncate_and_drop_head":
        lines = lines[:-3]
        heads._file(str(path.resolve())).unlink()
        expect = "no head checkpoint"
    elif tamper in ("emptied", "emptied_and_drop_head"):
        lines = []
        if tamper == "emptied_and_drop_head":
            heads._file(str(path.resolve())).unlink()
        expect = "empty"
    elif tamper == "deleted_head":
        heads._file(str(path.resolve())).unlink()
        expect = "no head checkpoint"
    else:
        monkeypatch.setenv("AGENTTUNE_AUDIT_KEY", "someone-elses-key-0123456789")
        expect = "line 1: HMAC mismatch"
    _rewrite(path, lines)
    result = verify_audit(path)
    assert not result.ok
    assert any(expect in p for p in result.problems), result.problems
    from typer.testing import CliRunner

    from agenttune_lib.cli.decide import app

    cli = CliRunner().invoke(app, ["verify-audit", str(path)])
    assert cli.exit_code == 1, cli.output


def test_writer_chains_across_restarts_and_refuses_a_log_without_head(tmp_path):
    path = tmp_path / "a.jsonl"
    AuditWriter(path).append({"record_type": "stage", "run_id": "r", "x": 1})
    AuditWriter(path).append({"record_type": "stage", "run_id": "r", "x": 2})
    assert verify_audit(path).ok and verify_audit(path).count == 2
    FileHeadStore()._file(str(path.resolve())).unlink()
    with pytest.raises(AuditError, match="no head checkpoint"):
        AuditWriter(path).append({"record_type": "run", "run_id": "r"})
    assert not verify_audit(path).ok


def test_writer_refuses_to_continue_a_truncated_log(tmp_path):
    path = tmp_path / "a.jsonl"
    writer = AuditWriter(path)
    for i in range(3):
        writer.append({"record_type": "stage", "run_id": "r", "x": i})
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))
    with pytest.raises(AuditError, match="truncated"):
        writer.append({"record_type": "stage", "run_id": "r", "x": 9})


class _Crash(RuntimeError):
    pass


def test_crash_between_append_and_head_update_is_reconciled(tmp_path):
    path = tmp_path / "a.jsonl"
    AuditWriter(path).append({"record_type": "stage", "run_id": "r", "x": 0})
    crashing = AuditWriter(path)

    def crash():
        raise _Crash("killed after the line's fsync, before the head update")

    crashing._after_append = crash
    with pytest.raises(_Crash):
        crashing.append({"record_type": "stage", "run_id": "r", "x": 1})
    assert len(path.read_text().splitlines()) == 2  # the line is there, the head is one behind
    state = verify_audit(path)
    assert state.ok and state.warnings and "past the head checkpoint" in state.warnings[0]
    AuditWriter(path).append({"record_type": "run", "run_id": "r"})  # a fresh writer reconciles under its lock
    result = verify_audit(path)
    assert result.ok and result.count == 3 and not result.warnings
    assert [json.loads(x)["seq"] for x in path.read_text().splitlines()] == [0, 1, 2]


def test_torn_final_line_is_cut_and_the_chain_continues(tmp_path):
    path = tmp_path / "a.jsonl"
    writer = AuditWriter(path)
    writer.append({"record_type": "stage", "run_id": "r", "x": 0})
    with open(path, "a") as fh:
        fh.write('{"record_type": "stage", "half-writ')  # a crash mid-write
    assert not verify_audit(path).ok
    writer.append({"record_type": "run", "run_id": "r"})
    result = verify_audit(path)
    assert result.ok and result.count == 2


def test_head_checkpoint_in_the_warehouse(tmp_path):
    from agenttune_lib.warehouse import Warehouse

    wh = Warehouse(tmp_path / "wh.duckdb")
    path = tmp_path / "logs" / "audit.jsonl"
    runner = GraphRunner.from_template(
        "kyc_triage", model=schema_model(), audit=AuditWriter(path, warehouse=wh), review_dir=tmp_path, human_review_timeout=0.0
    )
    runner.run(KYC_APPLICANT)
    head = WarehouseHeadStore(wh).get(str(path.resolve()))
    assert head is not None and head.count == len(path.read_text().splitlines())
    assert verify_audit(path, warehouse=wh).ok
    assert not verify_audit(path).ok  # no head for it among the files: the store matters
    wh.execute("DELETE FROM decide_audit_heads")
    assert any("no head checkpoint" in p for p in verify_audit(path, warehouse=wh).problems)


def test_key_file_must_live_apart_from_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTTUNE_AUDIT_KEY_FILE", str(tmp_path / "logs" / "audit.key"))
    with pytest.raises(AuditError, match="in the log's folder"):
        AuditWriter(tmp_path / "logs" / "audit.jsonl").append({"record_type": "stage", "run_id": "r"})
    monkeypatch.setenv("AGENTTUNE_AUDIT_KEY_FILE", str(tmp_path / "keys" / "audit.key"))
    AuditWriter(tmp_path / "logs" / "audit.jsonl").append({"record_type": "stage", "run_id": "r"})
    assert (tmp_path / "keys" / "audit.key").stat().st_mode & 0o077 == 0
    monkeypatch.delenv("AGENTTUNE_AUDIT_KEY_FILE")
    with pytest.raises(AuditError, match="no audit key"):
        verify_audit(tmp_path / "logs" / "audit.jsonl")


def test_missing_log_is_a_clear_error(tmp_path):
    with pytest.raises(AuditError, match="does not exist"):
        verify_audit(tmp_path / "nope.jsonl")


def test_personal_data_is_redacted_before_anything_is_written(tmp_path):
    path = filled_log(tmp_path, runs=1)
    text = path.read_text()
    for value in PERSONAL:
        assert value not in text
    assert "[REDACTED:name]" in text and "[REDACTED:annual_income]" in text
    assert "A-0" in text and "DK" in text  # non-personal fields survive
    assert verify_audit(path).ok


def test_redaction_reaches_prompts_replies_and_eventlogs(tmp_path):
    def echo(request):
        if request.stage_id == "extract":
            return json.dumps({"age": 46, "nationality": "DK", "source_of_funds_stated": True, "income_band": "high",
                               "note": "Margarethe Vestergaard works at Nordlys Shipping ApS"})
        if request.stage_id == "risk":
            return json.dumps({"risk_level": "high", "confidence": 0.7, "reason": "Margarethe Vestergaard: income 612345"})
        return schema_model().generate(request)

    path = tmp_path / "audit.jsonl"
    runner = GraphRunner.from_template("kyc_triage", model=echo, audit=path, review_dir=tmp_path, human_review_timeout=0.0)
    result = CollectRunner(runner).collect([KYC_APPLICANT])
    state = result.states[0]
    assert state.input["name"] == "Margarethe Vestergaard"  # in memory the run sees the data
    log_text = result.logs[0].to_json()
    for value in PERSONAL:
        assert value not in path.read_text()
        assert value not in log_text
    review = list((tmp_path / "pending_reviews").glob("*.json"))
    assert review and state.verdict["label"] == "decline"  # high risk went to review, which timed out
    for f in review:
        for value in PERSONAL:
            assert value not in f.read_text()


def test_redactor_masks_by_key_and_value():
    red = Redactor(["name", "income"], {"name": "Ann Lee", "income": 50000})
    out = red({"name": "Ann Lee", "prompt": "Customer Ann Lee earns 50000.", "nested": [{"income": 1}], "run_id": "Ann Lee"})
    assert out == {
        "name": "[REDACTED:name]",
        "prompt": "Customer [REDACTED:name] earns [REDACTED:income].",
        "nested": [{"income": "[REDACTED:income]"}],
        "run_id": "Ann Lee",
    }
    assert Redactor([])({"name": "x"}) == {"name": "x"}
    nested = Redactor(["name"], {"applicants": [{"name": "Jo Quist"}, {"name": "Al Berg"}]})
    assert nested("Jo Quist and Al Berg") == "[REDACTED:name] and [REDACTED:name]"


def test_reader_groups_runs(tmp_path):
    path = filled_log(tmp_path, runs=2)
    runs = AuditReader(path).runs()
    assert len(runs) == 2
    for entry in runs.values():
        assert entry["run"]["record_type"] == "run" and entry["stages"]
        assert entry["run"]["steps"] == len([s for s in entry["stages"] if not s.get("parent")])


def test_one_runner_serves_concurrent_runs_without_mixing_redaction(tmp_path):
    import concurrent.futures

    path = tmp_path / "audit.jsonl"
    runner = GraphRunner.from_template("kyc_triage", model=schema_model(), audit=path, review_dir=tmp_path, human_review_timeout=0.0)
    people = [f"Person Number{i} Testcase" for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        states = list(pool.map(lambda n: runner.run({**KYC_APPLICANT, "name": n}), people))
    assert all(s.completed for s in states) and len({s.run_id for s in states}) == 6
    text = path.read_text()
    for name in people:
        assert name not in text
    assert verify_audit(path).ok
    assert len(AuditReader(path).runs()) == 6


def test_threads_sharing_a_runner_open_one_checkpointer_and_build_one_graph(tmp_path):
    """The first runs of a shared runner start together: the SQLite checkpointer and the graph are made once."""
    import threading

    runner = GraphRunner.from_template("kyc_triage", model=schema_model(), audit=None, review_dir=tmp_path, human_review_timeout=0.0)
    barrier = threading.Barrier(8)
    seen = []

    def first_use():
        barrier.wait()
        seen.append((id(runner.checkpointer), id(runner.compile())))

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8 and len(set(seen)) == 1


def test_redaction_keeps_a_json_input_text_valid_json():
    """Numeric personal fields inside a JSON input_text are masked as strings, so replays can still parse it."""
    import json as _json

    from agenttune_lib.decide.audit import Redactor

    redact = Redactor(["income", "name"], {"income": 52000, "name": "Bob Smith"})
    out = redact({"input_text": _json.dumps({"income": 52000, "name": "Bob Smith", "country": "ES"})})
    parsed = _json.loads(out["input_text"])
    assert parsed == {"income": "[REDACTED:income]", "name": "[REDACTED:name]", "country": "ES"}
    assert redact("Bob Smith earns 52000") == "[REDACTED:name] earns [REDACTED:income]"


def test_cli_finds_a_dagster_written_head_in_the_platform_warehouse(platform_home):
    """A log whose head is in the platform warehouse (decide_runs) verifies and continues from the CLI defaults."""
    from typer.testing import CliRunner

    from agenttune_lib.cli.decide import app
    from agenttune_lib.config import PlatformPaths

    wh = PlatformPaths.from_env().warehouse
    path = PlatformPaths.from_env().artifacts / "decide" / "audit.jsonl"
    AuditWriter(path, warehouse=wh).append({"record_type": "stage", "run_id": "r"})
    AuditWriter(path).append({"record_type": "run", "run_id": "r"})  # the CLI's writer finds the warehouse head
    assert WarehouseHeadStore(wh).get(str(path.resolve())).count == 2
    out = CliRunner().invoke(app, ["verify-audit", str(path)])
    assert out.exit_code == 0, out.output
