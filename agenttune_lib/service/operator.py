"""The operator page (``/operator``): pending DECIDE human reviews with approve/reject (a named reviewer; each decision
resumes its run, which writes the decision into the audit chain), what is deployed, its gate decision, recent traffic."""
from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from agenttune_lib.service.errors import APIError
from agenttune_lib.service.schemas import ReviewDecisionRequest

__all__ = ["add_operator_routes", "operator_state", "decide_review"]


def _gate(warehouse: Any, decision_id: str | None) -> dict[str, Any] | None:
    if not decision_id or not warehouse.has_table("gate_decisions"):
        return None
    from agenttune_lib.closed_loop.gate import load_gate_decision

    try:
        d = load_gate_decision(warehouse, decision_id=decision_id)
    except KeyError:
        return None
    return {"decision_id": d.decision_id, "approved": d.approved, "candidate": d.candidate, "baseline": d.baseline, "reasons": list(d.reasons)}


def operator_state(state: Any) -> dict[str, Any]:
    """What the page shows, as JSON: deployed adapter + its gate decision, pending reviews, recent scored traffic."""
    from agenttune_lib.decide.review import pending_reviews

    wh, cfg = state.warehouse, state.config
    try:
        served = state.registry.deployed().to_dict()
    except (ValueError, FileNotFoundError) as exc:
        served = {"error": str(exc)}
    reviews = pending_reviews(cfg.review_dir) if cfg.review_dir else []
    traffic: list[dict[str, Any]] = []
    per_adapter: list[dict[str, Any]] = []
    if wh.has_table("served_feedback"):
        traffic = [{"seq": s, "request_id": r, "reward": w, "served_adapter_id": a, "at": str(t)} for s, r, w, a, t in wh.execute(
            "SELECT seq, request_id, reward, served_adapter_id, created_at FROM served_feedback ORDER BY seq DESC LIMIT 20")]
        per_adapter = [{"served_adapter_id": a, "n": int(n), "mean_reward": float(m)} for a, n, m in wh.execute(
            "SELECT served_adapter_id, count(*), avg(reward) FROM served_feedback GROUP BY 1 ORDER BY 1")]
    served_n = wh.execute("SELECT count(*) FROM trajectories WHERE source = 'serve'")[0][0] if wh.has_table("trajectories") else 0
    return {"deployed": served, "gate_decision": _gate(wh, served.get("decision_id")),
            "pending_reviews": [{k: r.get(k) for k in ("review_id", "run_id", "template_id", "stage_id", "question", "summary", "running_verdict", "deadline")}
                                for r in reviews],
            "recent_feedback": traffic, "reward_by_adapter": per_adapter, "served_requests": int(served_n)}


def decide_review(state: Any, review_id: str, body: ReviewDecisionRequest, runner_for: Callable[[str], Any]) -> dict[str, Any]:
    """Write the reviewer's decision file and resume its run from the checkpoint (the resume audits the decision)."""
    from agenttune_lib.decide.review import pending_reviews, resume_decided

    folder = state.config.review_dir
    if folder is None:
        raise APIError(404, "this service has no review folder (start it with --review-dir)", "reviews_disabled")
    pending = {r["review_id"]: r for r in pending_reviews(folder)}
    if review_id not in pending:
        raise APIError(404, f"no pending review {review_id!r} in {folder}", "review_not_found", "review_id")
    decisions = Path(folder) / "decisions"
    decisions.mkdir(parents=True, exist_ok=True)
    tmp = decisions / f".{review_id}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps({"review_id": review_id, "decision": body.decision, "reviewer": body.reviewer.strip(),
                               "comment": body.comment}), encoding="utf-8")
    os.replace(tmp, decisions / f"{review_id}.json")
    outcomes = resume_decided(folder, runner_for, run_id=pending[review_id]["run_id"])
    out = next((o for o in outcomes if o.review_id == review_id), None)
    if out is None or out.action != "resumed":
        raise APIError(409, f"review {review_id!r} was not resumed: {out.error if out else 'no outcome'}", "resume_failed")
    st = out.state
    return {"review_id": review_id, "run_id": out.run_id, "decision": body.decision, "reviewer": body.reviewer.strip(),
            "status": st.status, "verdict": st.verdict}


def _default_runner_for(state: Any) -> Callable[[str], Any]:
    """A GraphRunner per template over the deployed model, the service's review folder and audit log."""
    from agenttune_lib.decide import GraphRunner, TemplateRegistry, default_audit_path
    from agenttune_lib.config import PlatformPaths

    cfg = state.config
    runners: dict[str, Any] = {}

    def runner_for(template_id: str) -> Any:
        if template_id not in runners:
            served = state.registry.deployed()
            runners[template_id] = GraphRunner(
                TemplateRegistry().get(template_id), model=served.decide_model(), review_dir=cfg.review_dir,
                audit=cfg.audit_path or default_audit_path(PlatformPaths.from_env().artifacts), checkpointer="default",
                served_adapter_id=served.served_adapter_id)
        return runners[template_id]

    return runner_for


def add_operator_routes(app: FastAPI, state: Any, runner_for: Callable[[str], Any] | None = None) -> None:
    runner_for = runner_for or _default_runner_for(state)

    @app.get("/operator", response_class=HTMLResponse)
    async def page() -> str:
        return PAGE

    @app.get("/operator/api/state")
    async def api_state() -> dict[str, Any]:
        return await run_in_threadpool(operator_state, state)

    @app.post("/operator/api/reviews/{review_id}")
    async def api_decide(review_id: str, body: ReviewDecisionRequest) -> dict[str, Any]:
        return await run_in_threadpool(decide_review, state, review_id, body, app.state.review_runner_for)

    app.state.review_runner_for = runner_for


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>AgentTune operator</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5rem;max-width:64rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.5rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;width:100%}td,th{border:1px solid #ddd;padding:.3rem .5rem;text-align:left;font-size:.9rem}
.ok{color:#060}.bad{color:#a00}.review{border:1px solid #ccc;padding:.6rem;margin:.5rem 0;border-radius:4px}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.4rem;font-size:.8rem}
</style></head><body>
<h1>AgentTune operator</h1>
<label>Reviewer <input id="reviewer" placeholder="your name or id"></label>
<h2>Deployed adapter</h2><div id="deployed">loading…</div>
<h2>Gate decision</h2><div id="gate">loading…</div>
<h2>Pending human reviews</h2><div id="reviews">loading…</div>
<h2>Recent traffic scores</h2><div id="traffic">loading…</div>
<p id="status" role="status"></p>
<script>
const key = new URLSearchParams(location.search).get('key');
const headers = key ? {'Authorization': 'Bearer ' + key} : {};
function esc(s){return String(s ?? '').replace(/[&<>"']/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));}
async function load(){
  const r = await fetch('/operator/api/state', {headers});
  const s = await r.json();
  const d = s.deployed;
  document.getElementById('deployed').innerHTML = d.error ? '<span class="bad">'+esc(d.error)+'</span>' :
    '<b id="served-adapter">'+esc(d.served_adapter_id)+'</b> on base '+esc(d.base_path)+(d.deployed_at ? ' since '+esc(d.deployed_at) : '');
  const g = s.gate_decision;
  document.getElementById('gate').innerHTML = g ? '<span id="gate-verdict" class="'+(g.approved?'ok':'bad')+'">'+(g.approved?'approved':'refused')+
    '</span> '+esc(g.decision_id)+' (candidate '+esc(g.candidate)+' vs '+esc(g.baseline || 'base model')+')<br>'+g.reasons.map(esc).join('<br>') :
    'no gate decision behind what serves (the base model serves)';
  const rv = document.getElementById('reviews');
  rv.innerHTML = s.pending_reviews.length ? '' : '<p id="no-reviews">no pending reviews</p>';
  for (const p of s.pending_reviews){
    const div = document.createElement('div'); div.className = 'review'; div.dataset.reviewId = p.review_id;
    div.innerHTML = '<b>'+esc(p.template_id)+'</b> run '+esc(p.run_id)+' at stage '+esc(p.stage_id)+'<br>'+esc(p.question)+
      '<pre>'+esc(p.summary)+'</pre>'+
      '<button class="approve">Approve</button> <button class="reject">Reject</button>';
    div.querySelector('.approve').onclick = () => decide(p.review_id, 'approved');
    div.querySelector('.reject').onclick = () => decide(p.review_id, 'denied');
    rv.appendChild(div);
  }
  const rows = s.reward_by_adapter.map(a => '<tr><td>'+esc(a.served_adapter_id)+'</td><td>'+a.n+'</td><td>'+a.mean_reward.toFixed(3)+'</td></tr>').join('');
  const recent = s.recent_feedback.map(f => '<tr><td>'+esc(f.request_id)+'</td><td>'+esc(f.served_adapter_id)+'</td><td>'+f.reward+'</td></tr>').join('');
  document.getElementById('traffic').innerHTML = '<p>'+s.served_requests+' served requests stored</p>'+
    '<table id="by-adapter"><tr><th>adapter</th><th>feedback</th><th>mean reward</th></tr>'+rows+'</table><br>'+
    '<table id="recent"><tr><th>request</th><th>adapter</th><th>reward</th></tr>'+recent+'</table>';
}
async function decide(id, decision){
  const reviewer = document.getElementById('reviewer').value.trim();
  const st = document.getElementById('status');
  if (!reviewer){ st.textContent = 'enter your reviewer name first'; st.className = 'bad'; return; }
  const r = await fetch('/operator/api/reviews/' + encodeURIComponent(id), {method: 'POST',
    headers: Object.assign({'Content-Type': 'application/json'}, headers), body: JSON.stringify({decision, reviewer})});
  const b = await r.json();
  st.textContent = r.ok ? ('review '+id+' '+decision+' by '+reviewer+': run '+b.status) : ('error: '+b.error.message);
  st.className = r.ok ? 'ok' : 'bad';
  await load();
}
load();
</script></body></html>
"""
