"""DeploymentGate: old vs new on held-out cases rebuilt from past successful runs, a trajectory-metric arm, and a provenance arm."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agenttune_lib.closed_loop.criteria import DEFAULT_GUARDS, DEFAULT_TARGETS, SuiteCriterion, judge_criterion
from agenttune_lib.closed_loop.detector import FailureDetector
from agenttune_lib.closed_loop.generator import render_response
from agenttune_lib.closed_loop.types import HoldoutCase, Run, TrainingExample, stable_id

__all__ = [
    "GateConfig", "HoldoutCase", "GateDecision", "DeploymentGate", "build_holdout", "trajectory_composite",
    "LikelihoodPolicy", "GATE_DECISIONS_DDL", "record_gate_decision", "newest_by_key", "decide_verdict_row",
]

#: Direction per trajectory metric (+1 higher is better); only the [0, 1]-bounded ones enter the composite.
_BOUNDED = {"TAC": 1, "ARR": -1, "SCSR": 1, "LCF": -1, "PAS": 1, "TER": 1, "ASE": 1}


def trajectory_composite(means: Mapping[str, float | None]) -> float | None:
    """One score in [0, 1] from TrajectoryEvaluator means: bounded metrics, lower-is-better ones flipped."""
    vals = [v if d > 0 else 1.0 - v for k, d in _BOUNDED.items() if (v := means.get(k)) is not None]
    return statistics.fmean(vals) if vals else None


@dataclasses.dataclass(frozen=True)
class GateConfig:
    """Both arms must pass; the provenance arm refuses untrusted or dominant sources."""

    min_accuracy_gain: float = 0.0
    require_improvement: bool = True
    min_cases: int = 3
    trajectory_tolerance: float = 0.02
    require_trajectory_arm: bool = True
    max_source_share: float = 0.5
    min_examples_for_share: int = 5
    untrusted_sources: frozenset[str] = frozenset()
    #: Held-out DECIDE inputs replayed per decision (a fixed-size sample, not every past success). At 17 one flipped
    #: verdict puts the paired interval's bound at -0.29, past a 0.25 margin; at ~40 it is about -0.13.
    holdout_size: int = 48
    #: How far the candidate may fall behind the baseline on held-out rates, and on the evaluation's paired CI, and still pass.
    noninferiority_margin: float = 0.05
    #: Failing inputs the candidate must fix (share of the batch's replayed failures that now pass).
    min_fix_rate: float = 0.5
    #: Per kind of candidate (its training algorithm), the suites it was trained for: superiority on each.
    targets: Mapping[str, tuple[SuiteCriterion, ...]] = dataclasses.field(default_factory=lambda: dict(DEFAULT_TARGETS))
    #: Suites no candidate may regress beyond each one's non-inferiority margin.
    guards: tuple[SuiteCriterion, ...] = DEFAULT_GUARDS
    #: Processes the generative replay uses: 2 replays the baseline and the candidate at once, one core each (every
    #: DECIDE call runs on one torch thread, so each arm computes what it computes alone); 1 replays them in turn.
    replay_workers: int = 2

    def __post_init__(self) -> None:
        # holdout_size 0: no held-out replay (a served-only batch judged on its failures and the suites alone)
        for name, low in (("replay_workers", 1), ("holdout_size", 0), ("min_cases", 0), ("min_examples_for_share", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"GateConfig.{name} must be an integer >= {low}, got {value!r}")
        for name, low, high in (("noninferiority_margin", 0.0, 1.0), ("min_fix_rate", 0.0, 1.0), ("max_source_share", 0.0, 1.0),
                                ("trajectory_tolerance", 0.0, 1.0), ("min_accuracy_gain", -1.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"GateConfig.{name} must be a number in [{low:g}, {high:g}], got {value!r}")


def answer_key(response: str) -> str:
    """What accuracy compares: a structured verdict by its label, anything else by its stripped text."""
    try:
        obj = json.loads(response)
    except (TypeError, ValueError):
        return str(response).strip()
    if isinstance(obj, dict) and "label" in obj:
        return str(obj["label"])
    return json.dumps(obj, sort_keys=True)


def build_holdout(
    source: str | Path | Iterable[Run],
    exclude: Iterable[TrainingExample] = (),
    template: str | None = None,
    distractors: Iterable[str] = (),
    detector: FailureDetector | None = None,
    system_prompt: str | None = None,
) -> list[HoldoutCase]:
    """Held-out cases from past successful runs (an audit log path or Runs), disjoint from the training examples.

    Each case's candidates are every distinct successful output of the template plus the
    ``distractors`` (typically the rejected responses the retrain learned to avoid).
    """
    detector = detector or FailureDetector()
    runs = detector.read_audit(source, 0).runs if isinstance(source, (str, Path)) else list(source)
    failed = {f.trajectory_id for f in detector.detect(runs)}
    excluded = list(exclude)
    ex_traj = {e.trajectory_id for e in excluded}
    ex_inputs = {m["content"] for e in excluded for m in e.prompt if m.get("role") == "user"}
    ex_inputs |= {e.metadata["input"] for e in excluded if isinstance(e.metadata.get("input"), str)}
    good = [
        r for r in runs
        if r.trajectory_id not in failed and r.succeeded is not False and r.output is not None
        and (template is None or r.template == template)
        and r.trajectory_id not in ex_traj and r.input not in ex_inputs
    ]
    outputs = sorted({render_response(r.output) for r in good})
    extra = sorted({d for d in distractors if d})
    cases = []
    for r in good:
        expected = render_response(r.output)
        prompt = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user", "content": r.input}]
        cands = tuple(dict.fromkeys([expected, *outputs, *extra]))
        cases.append(HoldoutCase(stable_id("holdout", r.trajectory_id), prompt, expected, cands, r.trajectory_id, r.input, r.template))
    return cases


def newest_by_key(comparisons: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per ``suite/metric``, the newest comparison row among every report of the candidate (a later report
    without a suite never hides an earlier one that has it)."""
    out: dict[str, dict[str, Any]] = {}
    for row in comparisons:
        key = f"{row.get('suite')}/{row.get('metric')}"
        have = out.get(key)
        if have is None or str(row.get("created_at") or "") >= str(have.get("created_at") or ""):
            out[key] = dict(row)
    return out


def decide_verdict_row(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Held-out DECIDE replays (baseline, candidate) as one paired comparison row: suite ``decide``, metric ``verdict_accuracy``."""
    pairs = [(o, c) for o, c in zip(old, new) if o.get("kind") == "holdout" and o.get("verdict_correct") is not None
             and c.get("verdict_correct") is not None]
    row: dict[str, Any] = {"suite": "decide", "metric": "verdict_accuracy", "n": len(pairs), "higher_is_better": True,
                           "base_mean": None, "candidate_mean": None, "diff": None, "ci_low": None, "ci_high": None}
    if len(pairs) < 2:
        return row
    from agenttune_lib.evaluation.paired import paired_comparison

    pc = paired_comparison([float(o["verdict_correct"]) for o, _ in pairs], [float(c["verdict_correct"]) for _, c in pairs], metric="verdict_accuracy")
    row.update({"base_mean": pc.base_mean, "candidate_mean": pc.candidate_mean, "diff": pc.diff, "ci_low": pc.ci_low, "ci_high": pc.ci_high})
    return row


class LikelihoodPolicy:
    """Answers a held-out case with the candidate the model gives the highest mean token log-probability."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer

    def score(self, prompt: list[dict[str, str]], completion: str) -> float:
        import torch

        tok = self.tokenizer
        head = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        full = head + completion + (tok.eos_token or "")
        head_ids = tok(head, add_special_tokens=False)["input_ids"]
        ids = tok(full, add_special_tokens=False)["input_ids"]
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = self.model(input_ids=x).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1)
        target = x[0, 1:]
        lp = logp.gather(-1, target[:, None])[:, 0][len(head_ids) - 1:]
        return float(lp.mean()) if lp.numel() else float("-inf")

    def __call__(self, case: HoldoutCase) -> str:
        self.model.eval()
        return max(case.candidates, key=lambda c: self.score(case.prompt, c))


@dataclasses.dataclass
class GateDecision:
    """Whether the candidate adapter may replace the serving one, with every arm's figures."""

    decision_id: str
    approved: bool
    candidate: str | None
    baseline: str | None
    batch_id: str | None
    arms: dict[str, dict[str, Any]]
    reasons: list[str]
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class DeploymentGate:
    """``evaluate_decision``: accuracy arm, trajectory arm and provenance arm; approval needs all three."""

    def __init__(self, config: GateConfig | None = None) -> None:
        self.config = config or GateConfig()

    def accuracy_arm(self, cases: Sequence[HoldoutCase], old: Callable[[HoldoutCase], str], new: Callable[[HoldoutCase], str]) -> dict[str, Any]:
        c = self.config
        if len(cases) < c.min_cases:
            return {"passed": False, "n_cases": len(cases), "reason": f"only {len(cases)} held-out cases from successful runs (need {c.min_cases})"}
        old_hits = [answer_key(old(case)) == answer_key(case.expected) for case in cases]
        new_hits = [answer_key(new(case)) == answer_key(case.expected) for case in cases]
        acc_old = sum(old_hits) / len(cases)
        acc_new = sum(new_hits) / len(cases)
        gain = acc_new - acc_old
        passed = gain >= c.min_accuracy_gain and (gain > 0 or not c.require_improvement)
        return {
            "passed": passed, "n_cases": len(cases), "accuracy_old": acc_old, "accuracy_new": acc_new, "gain": gain,
            "case_ids": [case.case_id for case in cases],
            "reason": None if passed else f"accuracy {acc_old:.2f} -> {acc_new:.2f} (gain {gain:+.2f}, need > {c.min_accuracy_gain:.2f})",
        }

    def trajectory_arm(self, old: Mapping[str, float | None] | None, new: Mapping[str, float | None] | None) -> dict[str, Any]:
        c = self.config
        if old is None or new is None:
            passed = not c.require_trajectory_arm
            return {"passed": passed, "exercised": False, "reason": None if passed else "trajectory metrics missing for the old or the new adapter"}
        comp_old, comp_new = trajectory_composite(old), trajectory_composite(new)
        if comp_old is None or comp_new is None:
            passed = not c.require_trajectory_arm
            return {"passed": passed, "exercised": False, "reason": None if passed else "no bounded trajectory metric to compare"}
        regressions = {
            k: (old[k], new[k]) for k, d in _BOUNDED.items()
            if old.get(k) is not None and new.get(k) is not None and d * (new[k] - old[k]) < -c.trajectory_tolerance
        }
        passed = comp_new >= comp_old - c.trajectory_tolerance
        return {
            "passed": passed, "exercised": True, "composite_old": comp_old, "composite_new": comp_new,
            "regressed_metrics": regressions, "tolerance": c.trajectory_tolerance,
            "reason": None if passed else f"trajectory composite {comp_old:.3f} -> {comp_new:.3f} regressed beyond {c.trajectory_tolerance}",
        }

    def provenance_arm(self, examples: Sequence[TrainingExample], untrusted_trajectories: Iterable[str] = ()) -> dict[str, Any]:
        c = self.config
        bad_traj = set(untrusted_trajectories)
        untrusted = [
            e.example_id for e in examples
            if not e.trusted or e.source in c.untrusted_sources or e.trajectory_id in bad_traj
        ]
        shares = Counter(e.source or "unknown" for e in examples)
        top, top_n = shares.most_common(1)[0] if shares else (None, 0)
        share = top_n / len(examples) if examples else 0.0
        dominant = len(examples) >= c.min_examples_for_share and share > c.max_source_share
        reasons = []
        if untrusted:
            reasons.append(f"{len(untrusted)} training examples trace to untrusted inputs")
        if dominant:
            reasons.append(f"source {top!r} supplies {share:.0%} of the batch (limit {c.max_source_share:.0%})")
        return {
            "passed": not reasons, "n_examples": len(examples), "untrusted_examples": untrusted,
            "top_source": top, "top_share": share, "max_source_share": c.max_source_share,
            "reason": "; ".join(reasons) or None,
        }

    def replay_arm(self, old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], has_batch: bool = True) -> dict[str, Any]:
        """Generative replay of a retrain batch: its failures must now pass under the candidate (and more than under the
        baseline); held-out verdict accuracy, stage correctness, loop-collapse and step-limit rates must be non-inferior.

        Without a retrain batch (``has_batch=False``) the arm does not apply (``exercised`` False): the held-out
        replays are recorded here and judged once, as the ``decide/verdict_accuracy`` guard with its own margin and n."""
        from agenttune_lib.closed_loop.replay import replay_summary

        c = self.config
        fo, fn = replay_summary(old, "failure"), replay_summary(new, "failure")
        ho, hn = replay_summary(old, "holdout"), replay_summary(new, "holdout")
        summaries = {"failures_old": fo, "failures_new": fn, "holdout_old": ho, "holdout_new": hn, "margin": c.noninferiority_margin}
        if not has_batch:
            return {"passed": True, "exercised": False, "has_batch": False, **summaries, "reason": None}
        reasons = []
        if fn["n"] == 0:
            reasons.append("no failing input of the batch could be replayed (examples lack template/input)")
        else:
            if (fn["pass_rate"] or 0.0) < c.min_fix_rate:
                reasons.append(f"the candidate fixes {fn['pass_rate']:.2f} of the batch's failures (need {c.min_fix_rate:.2f})")
            if c.require_improvement and (fn["pass_rate"] or 0.0) <= (fo["pass_rate"] or 0.0):
                reasons.append(f"failures passing {fo['pass_rate']:.2f} -> {fn['pass_rate']:.2f}: no improvement over the baseline")
        m = c.noninferiority_margin
        for key, sign in (("verdict_accuracy", 1), ("stage_correct", 1), ("loop_collapse_rate", -1), ("step_limit_rate", -1)):
            a, b = ho.get(key), hn.get(key)
            if a is not None and b is not None and sign * (b - a) < -m:
                reasons.append(f"held-out {key} {a:.2f} -> {b:.2f} (margin {m:.2f})")
        need = min(c.min_cases, c.holdout_size)  # a configured sample smaller than min_cases is the operator's choice
        if hn["n"] < need:
            reasons.append(f"only {hn['n']} held-out inputs replayed (need {need})")
        return {"passed": not reasons, "exercised": True, "has_batch": True, **summaries, "reason": "; ".join(reasons) or None}

    def target_arm(self, kind: str, rows: Mapping[str, Mapping[str, Any]], has_batch: bool) -> dict[str, Any]:
        """Superiority on the suites a ``kind`` candidate was trained for (a retrain's own target is the replay arm)."""
        criteria = tuple(self.config.targets.get(kind, ()))
        if not criteria:
            if has_batch:
                return {"passed": True, "exercised": False, "kind": kind, "criteria": [], "reason": None}
            return {"passed": False, "exercised": False, "kind": kind, "criteria": [],
                    "reason": f"no target suite is configured for a {kind!r} candidate (GateConfig.targets): nothing says what it should improve"}
        judged = [judge_criterion(c, rows.get(c.key), "target") for c in criteria]
        bad = [j["reason"] for j in judged if not j["passed"]]
        return {"passed": not bad, "exercised": True, "kind": kind, "criteria": judged, "reason": "; ".join(bad) or None}

    def guard_arm(self, rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """Non-inferiority on every guard suite; a guard with no comparison for the candidate is a refusal naming it."""
        judged = [judge_criterion(c, rows.get(c.key), "guard") for c in self.config.guards]
        bad = [j["reason"] for j in judged if not j["passed"]]
        return {"passed": not bad, "exercised": bool(judged), "criteria": judged, "reason": "; ".join(bad) or None}

    def evaluate_decision(
        self,
        cases: Sequence[HoldoutCase] = (),
        old_policy: Callable[[HoldoutCase], str] | None = None,
        new_policy: Callable[[HoldoutCase], str] | None = None,
        examples: Sequence[TrainingExample] = (),
        trajectory_old: Mapping[str, float | None] | None = None,
        trajectory_new: Mapping[str, float | None] | None = None,
        candidate: str | None = None,
        baseline: str | None = None,
        batch_id: str | None = None,
        untrusted_trajectories: Iterable[str] = (),
        replay_old: Sequence[Mapping[str, Any]] | None = None,
        replay_new: Sequence[Mapping[str, Any]] | None = None,
        comparisons: Sequence[Mapping[str, Any]] = (),
        candidate_kind: str = "distill",
    ) -> GateDecision:
        """Score old against new; approve only if every arm passes.

        ``targets``: superiority on the suites a ``candidate_kind`` candidate was trained for; ``guards``: non-inferiority
        on every guard suite (the paired ``comparisons`` of every report of the candidate, newest per suite/metric, plus
        the held-out DECIDE replays as ``decide/verdict_accuracy``). With a retrain batch the generative ``replay`` arm
        must also show its failures fixed; without one that part does not apply. Without replay outcomes the ranking
        ``accuracy`` arm scores ``old_policy``/``new_policy`` on held-out cases instead.
        """
        has_batch = batch_id is not None or bool(examples)
        arms = {"provenance": self.provenance_arm(examples, untrusted_trajectories)}
        rows = newest_by_key(comparisons)
        if replay_old is not None and replay_new is not None:
            arms["replay"] = self.replay_arm(replay_old, replay_new, has_batch=has_batch)
            rows.setdefault("decide/verdict_accuracy", decide_verdict_row(replay_old, replay_new))
        else:
            if old_policy is None or new_policy is None:
                raise ValueError("evaluate_decision needs replay outcomes, or held-out cases with old and new policies")
            arms["accuracy"] = self.accuracy_arm(cases, old_policy, new_policy)
        # A retrain's target is its batch (the replay arm); ``candidate_kind`` names what a batch-less candidate was trained for.
        arms["targets"] = self.target_arm("retrain" if has_batch else candidate_kind, rows, has_batch)
        arms["guards"] = self.guard_arm(rows)
        arms["trajectory"] = self.trajectory_arm(trajectory_old, trajectory_new)
        reasons = [f"{name}: {arm['reason']}" for name, arm in arms.items() if not arm["passed"]]
        now = dt.datetime.now(dt.timezone.utc).isoformat()
        return GateDecision(
            decision_id=stable_id("gate", candidate, baseline, batch_id, now),
            approved=not reasons, candidate=candidate, baseline=baseline, batch_id=batch_id,
            arms=arms, reasons=reasons, created_at=now,
        )


GATE_DECISIONS_DDL = """CREATE TABLE IF NOT EXISTS gate_decisions (
    decision_id VARCHAR PRIMARY KEY, candidate VARCHAR, baseline VARCHAR, batch_id VARCHAR, approved BOOLEAN,
    accuracy_old DOUBLE, accuracy_new DOUBLE, n_cases BIGINT, arms VARCHAR, reasons VARCHAR, run_id VARCHAR,
    created_at TIMESTAMPTZ)"""


def record_gate_decision(warehouse: Any, decision: GateDecision, run_id: str | None = None) -> None:
    """Store a decision in the warehouse's ``gate_decisions`` table (idempotent on decision_id)."""
    acc = dict(decision.arms.get("accuracy", {}))
    if "replay" in decision.arms:  # the figures the retrain changed: failures passing, old vs new
        rp = decision.arms["replay"]
        acc = {"accuracy_old": rp["failures_old"]["pass_rate"], "accuracy_new": rp["failures_new"]["pass_rate"],
               "n_cases": rp["failures_new"]["n"] + rp["holdout_new"]["n"]}
    with warehouse.connect() as con:
        warehouse.create_tables(con, GATE_DECISIONS_DDL)
        con.execute(
            "INSERT OR REPLACE INTO gate_decisions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [decision.decision_id, decision.candidate, decision.baseline, decision.batch_id, decision.approved,
             acc.get("accuracy_old"), acc.get("accuracy_new"), acc.get("n_cases"),
             json.dumps(decision.arms, sort_keys=True, default=str), json.dumps(decision.reasons), run_id,
             dt.datetime.fromisoformat(decision.created_at)],
        ).fetchall()


def load_gate_decision(warehouse: Any, decision_id: str | None = None, run_id: str | None = None) -> GateDecision:
    """A stored decision by id, else the newest one a run wrote, else the newest overall."""
    if not warehouse.has_table("gate_decisions"):
        raise KeyError(f"no gate decisions in {warehouse!r} yet")
    if decision_id:
        rows = warehouse.query_arrow("SELECT * FROM gate_decisions WHERE decision_id = ?", [decision_id]).to_pylist()
    elif run_id:
        rows = warehouse.query_arrow("SELECT * FROM gate_decisions WHERE run_id = ? ORDER BY created_at DESC LIMIT 1", [run_id]).to_pylist()
    else:
        rows = warehouse.query_arrow("SELECT * FROM gate_decisions ORDER BY created_at DESC LIMIT 1").to_pylist()
    if not rows:
        raise KeyError(f"no gate decision {decision_id or run_id or ''!r} in {warehouse!r}")
    r = rows[0]
    return GateDecision(
        decision_id=r["decision_id"], approved=bool(r["approved"]), candidate=r["candidate"], baseline=r["baseline"],
        batch_id=r["batch_id"], arms=json.loads(r["arms"]), reasons=json.loads(r["reasons"]), created_at=r["created_at"].isoformat(),
    )
