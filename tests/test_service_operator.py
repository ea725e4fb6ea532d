"""The operator page served by the same app, in headless Chromium (Playwright): the deployed adapter and its gate
decision, recent traffic scores, and pending DECIDE human reviews approved and rejected by a named reviewer, each
decision resuming its run and landing in the verified audit chain. A screenshot is written for CI's artifacts."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import openai
import pytest

from _decide_helpers import schema_model
from _service_helpers import approve, free_port, running_service, tiny_adapter
from agenttune_lib.decide import AuditReader, CollectRunner, GraphRunner, verify_audit

CHROMIUM = "/usr/bin/chromium"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HIGH_RISK = {"risk": {"risk_level": "high", "confidence": 0.7, "reason": "large unexplained income"}}


def _runner(tmp_path):
    return GraphRunner.from_template("kyc_triage", model=schema_model(by_stage=HIGH_RISK), audit=tmp_path / "audit.jsonl",
                                     review_dir=tmp_path / "reviews", checkpointer="default")


@pytest.fixture
def operator_service(tmp_path):
    from agenttune_lib.closed_loop import AdapterDeployer
    from agenttune_lib.closed_loop.gate import record_gate_decision
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.service import ServiceConfig
    from agenttune_lib.warehouse import Warehouse

    result = CollectRunner(_runner(tmp_path)).collect(_runner(tmp_path).config.examples[:3])
    assert [s.status for s in result.states] == ["suspended", "completed", "suspended"]
    base = save_tiny_model(tmp_path / "tiny")
    wh = Warehouse(tmp_path / "wh.duckdb")
    decision = approve("a1")
    record_gate_decision(wh, decision, "run-1")
    AdapterDeployer(tmp_path / "deployed", wh).apply_decision(decision, tiny_adapter(base, tmp_path / "a1"), adapter_id="a1")
    config = ServiceConfig(base_path=base, deploy_root=tmp_path / "deployed", warehouse_path=str(wh.path), port=free_port(), redact=False,
                           review_dir=tmp_path / "reviews", audit_path=tmp_path / "audit.jsonl", default_max_tokens=4)
    fresh = _runner(tmp_path)
    with running_service(config, review_runner_for=lambda template_id: fresh) as (url, app):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        rids = [client.chat.completions.create(model="deployed", messages=[{"role": "user", "content": f"q{i}"}]).id for i in range(2)]
        for rid, reward in zip(rids, (1.0, 0.25)):
            assert httpx.post(url + "/v1/feedback", json={"request_id": rid, "reward": reward}).status_code == 200
        yield url, tmp_path, result


def test_operator_api_requires_a_reviewer_and_names_what_serves(operator_service):
    url, tmp_path, result = operator_service
    state = httpx.get(url + "/operator/api/state").json()
    assert state["deployed"]["served_adapter_id"] == "a1" and state["gate_decision"]["approved"] is True
    assert state["gate_decision"]["decision_id"] == "d-a1" and state["served_requests"] == 2
    assert state["reward_by_adapter"] == [{"served_adapter_id": "a1", "n": 2, "mean_reward": 0.625}]
    assert {p["run_id"] for p in state["pending_reviews"]} == {result.states[0].run_id, result.states[2].run_id}
    review_id = state["pending_reviews"][0]["review_id"]
    r = httpx.post(f"{url}/operator/api/reviews/{review_id}", json={"decision": "approved", "reviewer": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reviewer"
    r = httpx.post(f"{url}/operator/api/reviews/nope", json={"decision": "approved", "reviewer": "officer-17"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "review_not_found"
    assert len(httpx.get(url + "/operator/api/state").json()["pending_reviews"]) == 2  # nothing was decided


def _require_browser():
    missing = []
    if not Path(CHROMIUM).exists():
        missing.append(f"Debian's chromium at {CHROMIUM} (opt in with `bash .ci/install-chromium`; .ci/run does it in CI)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright Python package")
    if missing and not IN_CI:
        pytest.skip("browser test needs " + " and ".join(missing))
    assert not missing, "CI must run the browser test; missing " + " and ".join(missing)


@pytest.mark.slow
def test_operator_page_in_chromium_approves_and_rejects_into_the_audit_chain(operator_service):
    _require_browser()
    from playwright.sync_api import expect, sync_playwright

    url, tmp_path, result = operator_service
    approved_run, denied_run = result.states[0].run_id, result.states[2].run_id
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.goto(url + "/operator", wait_until="networkidle")
        expect(page.locator("#served-adapter")).to_have_text("a1")
        expect(page.locator("#gate-verdict")).to_have_text("approved")
        expect(page.locator("#by-adapter")).to_contain_text("0.625")
        expect(page.locator(".review")).to_have_count(2)
        shots = Path(os.environ.get("AGENTTUNE_UI_SCREENSHOTS", tmp_path))
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "operator-page.png"), full_page=True)
        # No reviewer named: refused in the page, nothing decided.
        page.locator(f'.review:has-text("{approved_run}") .approve').click()
        expect(page.locator("#status")).to_have_text("enter your reviewer name first")
        expect(page.locator(".review")).to_have_count(2)
        page.fill("#reviewer", "officer-17")
        page.locator(f'.review:has-text("{approved_run}") .approve').click()
        expect(page.locator(".review")).to_have_count(1)
        expect(page.locator("#status")).to_contain_text("approved by officer-17: run completed")
        page.locator(f'.review:has-text("{denied_run}") .reject').click()
        expect(page.locator("#no-reviews")).to_be_visible()
        expect(page.locator("#status")).to_contain_text("denied by officer-17")
        browser.close()
    assert (shots / "operator-page.png").stat().st_size > 10_000
    assert verify_audit(tmp_path / "audit.jsonl").ok
    runs = AuditReader(tmp_path / "audit.jsonl").runs()
    for run_id, decision in ((approved_run, "approved"), (denied_run, "denied")):
        review = [r for r in runs[run_id]["stages"] if r["stage_id"] == "review" and r["record_type"] == "stage"]
        assert review and review[0]["output"]["reviewer"] == "officer-17" and review[0]["output"]["decision"] == decision
    assert runs[approved_run]["run"]["label"] == "approve" and runs[denied_run]["run"]["label"] != "approve"
