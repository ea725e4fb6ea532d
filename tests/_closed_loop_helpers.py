"""Test helpers for the closed loop: example factories and a fresh warehouse."""
from __future__ import annotations

from agenttune_lib.closed_loop.types import TrainingExample, stable_id


def make_example(i: int, cause: str = "loop_collapse", accepted: bool = True, source: str | None = None, trusted: bool = True) -> TrainingExample:
    fid = stable_id("failure", cause, i)
    return TrainingExample(
        example_id=stable_id("example", fid),
        failure_id=fid,
        trajectory_id=f"traj-{i}",
        root_cause=cause,
        prompt=[{"role": "user", "content": f"case {i}"}],
        chosen=f"good {i}",
        rejected=f"bad {i}",
        accepted=accepted,
        source=source or f"src-{i}",
        trusted=trusted,
    )


KYC_APPLICANTS = [
    ("Ana Silva", "salaried", "approve"),
    ("Ben Okafor", "self-employed", "escalate"),
    ("Chen Wei", "salaried", "approve"),
    ("Dara Khan", "unemployed", "reject"),
    ("Eli Novak", "self-employed", "escalate"),
    ("Fay Moreau", "unemployed", "reject"),
    ("Gus Lind", "salaried", "approve"),
    ("Hana Sato", "self-employed", "escalate"),
    ("Ivo Petrov", "unemployed", "reject"),
]


def write_kyc_audit(path, n_loops: int = 6, n_ok: int = 9, crash: int = 0, source_of=None):
    """A DECIDE-shaped kyc_triage audit log through the real AuditWriter: successful runs and runs that loop."""
    from agenttune_lib.decide.audit import AuditWriter

    writer = AuditWriter(path)
    tid = "bfsi/kyc_triage"

    def stage(run_id, stage_id, stage_type, output, visit, step, **kw):
        writer.append({"record_type": "stage", "run_id": run_id, "template_id": tid, "stage_id": stage_id, "stage_type": stage_type,
                       "visit": visit, "step": step, "output": output, "status": kw.pop("status", "ok"), "error": kw.pop("error", None),
                       "score": kw.pop("score", None), **kw})

    for i in range(n_ok):
        name, job, label = KYC_APPLICANTS[i % len(KYC_APPLICANTS)]
        rid = f"ok-{i}"
        text = f"KYC application: {name}, employment {job}, documents complete, case {i}"
        stage(rid, "extract", "llm_call", {"employment": job}, 1, 1)
        stage(rid, "route", "router", "assess", 1, 2)
        stage(rid, "assess", "llm_call", {"label": label}, 1, 3)
        stage(rid, "judge", "llm_judge", {"passed": True}, 1, 4, score=0.9)
        run = {"record_type": "run", "run_id": rid, "template_id": tid, "status": "completed",
               "verdict": {"label": label, "confidence": 0.9, "reason": f"{job} applicant"}, "input_text": text,
               "visits": {"extract": 1, "route": 1, "assess": 1, "judge": 1}}
        if source_of:
            run["source"] = source_of(i, "ok")
        writer.append(run)
    for i in range(n_loops):
        name, job, label = KYC_APPLICANTS[(i + 1) % len(KYC_APPLICANTS)]
        rid = f"loop-{i}"
        text = f"KYC application: {name}, employment {job}, documents missing payslip, case {100 + i}"
        stage(rid, "extract", "llm_call", {"employment": job}, 1, 1)
        step = 2
        for v in range(1, 6):
            stage(rid, "route", "router", "request_documents", v, step)
            stage(rid, "request_documents", "llm_call", {"action": "request_documents"}, v, step + 1)
            step += 2
        run = {"record_type": "run", "run_id": rid, "template_id": tid, "status": "step_limit",
               "verdict": {"label": "step_limit", "confidence": 0.0, "reason": "max steps"}, "input_text": text,
               "visits": {"extract": 1, "route": 5, "request_documents": 5}}
        if source_of:
            run["source"] = source_of(i, "loop")
        writer.append(run)
    for i in range(crash):
        rid = f"crash-{i}"
        stage(rid, "extract", "llm_call", {"employment": "salaried"}, 1, 1)
        stage(rid, "sanctions", "tool_call", None, 1, 2, status="error", tool="sanctions_lookup", args={"nme": "x"},
              error={"type": "invalid_arguments", "message": "unexpected argument 'nme'", "tool": "sanctions_lookup"})
        writer.append({"record_type": "run", "run_id": rid, "template_id": tid, "status": "error",
                       "verdict": {"label": "error", "confidence": 0.0, "reason": "tool failed"},
                       "input_text": f"KYC application: crash case {i}", "visits": {"extract": 1, "sanctions": 1}})
    return path


# -- §4.2: a KYC-triage DECIDE pipeline whose document check is made by a (tiny) policy model ----------

DOCS_COMPLETE = '{"documents_complete": true, "missing": []}'
DOCS_MISSING = '{"documents_complete": false, "missing": ["proof_of_address"]}'


def kyc_applicant(i: int, loop: bool = False, documents: tuple[str, ...] = ("passport", "proof_of_address")) -> dict:
    return {"applicant_id": f"A-{2000 + i}", "name": f"Applicant {'L' if loop else 'S'}{i}", "date_of_birth": "1985-01-01", "age": 30 + i,
            "nationality": ["ES", "DE", "FR", "IT", "PT", "NL"][i % 6], "employer": f"Employer {i}", "annual_income": str(40000 + 1000 * i),
            "documents": list(documents), "source_of_funds": "salary"}


def kyc_stage_replies(doc_check=None):
    """Replies for every kyc_triage model stage except, optionally, the document check."""
    from agenttune_lib.decide import ScriptedModel

    def reply(request):
        if request.stage_id == "extract":
            return '{"age": 35, "nationality": "ES", "source_of_funds_stated": true, "income_band": "medium"}'
        if request.stage_id == "doc_check":
            return doc_check(request)
        if request.stage_id == "request_docs":
            return '{"request": "Please send a proof of address.", "resubmitted": false}'
        if request.stage_id == "risk":
            return '{"risk_level": "low", "confidence": 0.9, "reason": "salaried resident, documents on file"}'
        raise KeyError(f"no scripted reply for stage {request.stage_id!r}")

    return ScriptedModel(reply)


class PolicyChoiceModel:
    """A DECIDE model whose document check is the policy LM's choice between the two replies (by likelihood); other stages scripted."""

    def __init__(self, policy, stages=("doc_check",), options=(DOCS_COMPLETE, DOCS_MISSING)):
        self.policy = policy
        self.stages = set(stages)
        self.options = tuple(options)
        self.scripted = kyc_stage_replies(doc_check=self._choose)

    def _choose(self, request):
        msgs = [{"role": "user", "content": request.prompt}]
        return max(self.options, key=lambda o: self.policy.score(msgs, o))

    def generate(self, request):
        return self.scripted.generate(request)


def docs_rule(prompt: str) -> str:
    """The KYC document rule: complete when a proof of address is on file."""
    return DOCS_COMPLETE if "proof_of_address" in prompt else DOCS_MISSING


def kyc_teacher_reply(body):
    """A teacher behind an OpenAI-compatible endpoint: the KYC rules, by stage prompt."""
    prompt = body["messages"][-1]["content"]
    if "Onboarding requires an identity document" in prompt:
        text = docs_rule(prompt)
    elif "Extract the KYC facts" in prompt:
        text = '{"age": 35, "nationality": "ES", "source_of_funds_stated": true, "income_band": "medium"}'
    elif "Rate the customer's money-laundering risk" in prompt:
        text = '{"risk_level": "low", "confidence": 0.9, "reason": "salaried resident, documents on file"}'
    else:
        text = '{"request": "Please send a proof of address.", "resubmitted": false}'
    return {"choices": [{"message": {"role": "assistant", "content": text}}]}
