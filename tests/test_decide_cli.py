"""``agenttune decide list | validate | run | verify-audit | extract``."""
import json

from typer.testing import CliRunner

from agenttune_lib.cli import app
import pytest

# Audit keys, head checkpoints and artifacts go to a per-test $AGENTTUNE_HOME.
pytestmark = pytest.mark.usefixtures("platform_home")

CLI = CliRunner()


def test_list_shows_all_templates():
    result = CLI.invoke(app, ["decide", "list"])
    assert result.exit_code == 0, result.output
    for ident in ("bfsi/kyc_triage", "generic/multi_judge_scoring", "custom/kyc_triage_strict"):
        assert ident in result.output


def test_validate_good_bad_and_tricky_ids(tmp_path):
    ok = CLI.invoke(app, ["decide", "validate", "kyc_triage"])
    assert ok.exit_code == 0 and "ok: bfsi/kyc_triage" in ok.output
    bad = CLI.invoke(app, ["decide", "validate", "../../etc/passwd"])
    assert bad.exit_code == 1 and "rejected" in bad.output
    (tmp_path / "broken.yaml").write_text("stages:\n  - {id: a, type: nope}\n")
    broken = CLI.invoke(app, ["decide", "validate", "broken", "--templates-dir", str(tmp_path)])
    assert broken.exit_code == 1 and "template 'broken', stage 'a': unknown stage type 'nope'" in broken.output


def test_run_with_scripted_replies_then_verify_and_tamper(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"text": "I love it"}) + "\n" + json.dumps({"text": "I am cancelling"}) + "\n")
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({"score": ['{"sentiment": "positive", "intensity": 0.9, "mentions_cancellation": false}',
                                             '{"sentiment": "negative", "intensity": 0.8, "mentions_cancellation": true}']}))
    audit = tmp_path / "audit.jsonl"
    result = CLI.invoke(app, ["decide", "run", "sentiment", "--input", str(rows), "--replies", str(replies), "--audit", str(audit),
                              "--warehouse", str(tmp_path / "wh.duckdb")])
    assert result.exit_code == 0, result.output
    verdicts = [json.loads(line)["verdict"]["label"] for line in result.stdout.splitlines() if line.startswith("{")]
    assert verdicts == ["positive", "negative_escalate"]
    from agenttune_lib.warehouse import Warehouse

    assert len(Warehouse(tmp_path / "wh.duckdb").read_logs(source="decide")) == 2
    good = CLI.invoke(app, ["decide", "verify-audit", str(audit)])
    assert good.exit_code == 0 and "hash chain intact" in good.output
    lines = audit.read_text().splitlines()
    rec = json.loads(lines[1])
    rec["status"] = "error"
    lines[1] = json.dumps(rec, sort_keys=True)
    audit.write_text("\n".join(lines) + "\n")
    bad = CLI.invoke(app, ["decide", "verify-audit", str(audit)])
    assert bad.exit_code == 1 and "line 2: HMAC mismatch" in bad.output
    missing = CLI.invoke(app, ["decide", "verify-audit", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_run_reports_a_bad_input_file(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "ok"}\n{broken\n')
    result = CLI.invoke(app, ["decide", "run", "sentiment", "--input", str(rows), "--replies", str(rows)])
    assert result.exit_code == 1 and "line 2 is not JSON" in result.output


def test_extract_dpo_from_cli(tmp_path):
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"text": "hi"}]))
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({"score": ["nope", '{"sentiment": "neutral", "intensity": 0.5, "mentions_cancellation": false}']}))
    audit = tmp_path / "audit.jsonl"
    assert CLI.invoke(app, ["decide", "run", "sentiment", "-i", str(rows), "--replies", str(replies), "--audit", str(audit)]).exit_code == 0
    out = CLI.invoke(app, ["decide", "extract", str(audit), "--format", "dpo"])
    pairs = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(pairs) == 1 and pairs[0]["rejected"] == "nope" and pairs[0]["source"] == "retry"
