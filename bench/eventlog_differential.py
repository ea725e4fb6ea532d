"""Differential check of ``agenttune_lib/events.py`` against an earlier revision, on generated inputs.

Every projection's output and every error's type and text, compared case by case (ids drawn from a counter on
both sides). Run it after changing ``events.py``: ``python bench/eventlog_differential.py --rev HEAD~1 --cases 3000``.
Differences are printed; the exit status is 1 when there is any.
"""
import argparse, copy, importlib.util, math, random, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--rev", default="HEAD", help="git revision of the old events.py (default HEAD: the committed file)")
ap.add_argument("--new", default=str(ROOT / "agenttune_lib" / "events.py"), help="the events.py to check")
ap.add_argument("--cases", type=int, default=2000)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--ignore-all", action="store_true", help="do not compare __all__ (a name moved out on purpose)")
args = ap.parse_args()
old_src = subprocess.run(["git", "show", f"{args.rev}:agenttune_lib/events.py"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
old_path = Path(tempfile.mkdtemp()) / "events_old.py"
old_path.write_text(old_src)


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


OLD = load("events_old", old_path)
NEW = load("events_new", args.new)
R = random.Random(args.seed)
KINDS = ["text", "reasoning", "tool_call", "tool_result", "observation", "turn_complete", "reward", "memory_op", "TOOL_CALL", "bogus", None, 3]
def scalar():
    return R.choice([None, True, False, 0, 1, -5, 2**64, 2**63, -(2**63)-1, 1.5, float("nan"), float("inf"), "x", "", "a b", (1, 2), {1, 2}, b"x"])
def jv(d=0):
    r = R.random()
    if d > 2 or r < 0.4: return scalar() if R.random() < 0.2 else R.choice([None, True, 0, 7, 2.5, "s", "t", ""])
    if r < 0.7: return {R.choice(["a", "b", "content", "text", "name", "arguments", "id", "error", "output", "result", "items", "op", "stage_id", "value", "source", "observation", "tool", "args"] + ([1] if R.random() < .05 else [])): jv(d+1) for _ in range(R.randint(0, 4))}
    return [jv(d+1) for _ in range(R.randint(0, 3))]
def payload(kind):
    p = {}
    if R.random() < 0.8:
        for k in R.sample(["content", "text", "name", "arguments", "id", "error", "output", "result", "items", "op", "stage_id", "observation", "tool", "args", "value", "source", "verdict"], R.randint(0, 5)):
            p[k] = jv(1)
    if kind == "reward" and R.random() < 0.8: p["value"] = R.choice([1.0, 0, -2, 0.5, float("nan"), True, "1", None])
    if kind in ("tool_call", "tool_result") and R.random() < 0.7: p["name"] = R.choice(["search", "get", 3, None])
    if kind == "tool_call" and R.random() < 0.6: p["arguments"] = R.choice([{"q": "x"}, {}, {"b": 1, "a": [1, 2]}, None, "raw"])
    if kind == "tool_result" and R.random() < 0.5: p["id"] = R.choice(["c1", "c2", None, 1])
    if kind == "tool_call" and R.random() < 0.5: p["id"] = R.choice(["c1", "c2", None, 1])
    if kind == "tool_result" and R.random() < 0.4: p["error"] = R.choice(["boom", "", None, False, {"code": 1}])
    return p if R.random() > 0.03 else R.choice(["notmap", [1], None])
def event_dict(pos):
    kind = R.choice(KINDS[:8] * 4 + KINDS[8:])
    d = {"kind": kind, "payload": payload(kind)}
    if R.random() < 0.3:
        s = pos[0] + R.randint(-1, 2); e = s + R.randint(-1, 4); d["token_span"] = R.choice([[s, e], (s, e), [s], None, ["a", 1], [True, 2]]); 
        if isinstance(d["token_span"], (list, tuple)) and len(d["token_span"]) == 2 and all(type(x) is int for x in d["token_span"]): pos[0] = max(pos[0], d["token_span"][1])
    if R.random() < 0.15: d["logprobs"] = R.choice([[-0.1] * R.randint(0, 4), None, ["x"]])
    if kind == "reward" or R.random() < 0.05: d["scope"] = R.choice(["step", "turn", "episode", "episode", None, "bad"])
    if R.random() < 0.2: d["author"] = R.choice(["policy", "teacher", None, 5])
    return d
def log_kwargs():
    pos = [0]
    evs = [event_dict(pos) for _ in range(R.randint(0, 8))]
    tier = R.choice(["light", "full", "full", "bogus"])
    ids = list(range(R.randint(0, 12))) if R.random() < 0.7 else None
    md = {R.choice(["task", "system_prompt", "plan", "x", "answer"]): jv(1) for _ in range(R.randint(0, 3))}
    if R.random() < 0.3: md["task"] = R.choice(["Find it.", "", 3, None])
    if R.random() < 0.3: md["system_prompt"] = R.choice(["You are.", "", None])
    return dict(events=evs, tier=tier, id=R.choice(["L1", None, "L2"]) or "Lx", metadata=md, token_ids=ids)
def norm(v):
    if isinstance(v, (OLD.EventLog, NEW.EventLog)): return ("LOG", norm(v.to_dict()))
    if isinstance(v, (OLD.Event, NEW.Event)): return ("EV", norm(v.to_dict()))
    if isinstance(v, (OLD.EventKind, NEW.EventKind)): return ("K", v.value)
    if isinstance(v, dict): return {k: norm(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)): return type(v).__name__, [norm(x) for x in v]
    if isinstance(v, float) and math.isnan(v): return "NaN"
    return v
import uuid as _uuid
_CTR = [0]
class _U:
    def __init__(self, n): self.hex = f"{n:032x}"
def _uuid4():
    _CTR[0] += 1; return _U(_CTR[0])
_uuid.uuid4 = _uuid4
def run(mod, fn):
    _CTR[0] = 0
    try: return ("ok", norm(fn(mod)))
    except Exception as e: return ("err", type(e).__name__, str(e))
ops = 0; diffs = []
def cmp(label, fn):
    global ops; ops += 1
    a, b = run(OLD, fn), run(NEW, fn)
    if a != b: diffs.append((label, a, b))
N = args.cases
for case in range(N):
    kw = log_kwargs()
    def mk(m, kw=kw): return m.EventLog(copy.deepcopy(kw["events"]), tier=kw["tier"], id=kw["id"], metadata=copy.deepcopy(kw["metadata"]), token_ids=kw["token_ids"])
    cmp("ctor", mk)
    for meth in ["to_dict", "to_json", "to_eval_dict", "to_audit_records", "masked_tokens", "rewards", "__repr__", "__len__", "events"]:
        cmp(meth, lambda m, meth=meth: (lambda x: x() if callable(x) else x)(getattr(mk(m), meth)))
    cmp("rewards_scope", lambda m: mk(m).rewards(R.choice(["step", "episode", "bad", None])) if False else mk(m).rewards("episode"))
    cmp("rewards_bad", lambda m: mk(m).rewards("bad"))
    cmp("sft", lambda m: mk(m).as_dataset_rows("sft"))
    cmp("sft_bad", lambda m: mk(m).as_dataset_rows("dpo"))
    cmp("filter", lambda m: mk(m).filter("tool_call", "TEXT"))
    cmp("roundtrip_json", lambda m: m.EventLog.from_json(mk(m).to_json()))
    cmp("roundtrip_dict", lambda m: m.EventLog.from_dict(mk(m).to_dict()))
    cmp("eval_rt", lambda m: m.EventLog.from_eval_dict(mk(m).to_eval_dict()))
    cmp("eq", lambda m: mk(m) == m.EventLog.from_dict(mk(m).to_dict()))
    # from_eval_dict without steps
    ed = {"tool_calls": [{"name": R.choice(["a", "b", None]), R.choice(["arguments", "args"]): jv(1)} for _ in range(R.randint(0, 3))],
          "tool_outputs": [R.choice([{"output": jv(1), "error": R.choice([None, "e", ""])}, "plain", {"content": "c", "name": "z"}]) for _ in range(R.randint(0, 3))],
          "final_answer": R.choice([None, "ans", 3]), "rewards": R.choice([None, [1.0], [{"value": 0.5, "scope": "step", "source": "x"}], [{"value": "bad"}]]),
          "metadata": R.choice([None, {"a": 1}]), "task": R.choice([None, "t"]), "plan": R.choice([None, ["p"]]), "trajectory_id": R.choice([None, "T"])}
    if R.random() < 0.3: ed["steps"] = R.choice([[{"kind": "text", "payload": {"content": "x"}}], [{"payload": {}}], ["bad"], [{"kind": "reward", "payload": {"value": 1}, "scope": "step", "author": "a"}]])
    cmp("from_eval", lambda m: m.EventLog.from_eval_dict(copy.deepcopy(ed), id=R.choice([None]) ))
    # from_trajectory
    comp = list(range(R.randint(0, 10)))
    segs = []
    for _ in range(R.randint(0, 5)):
        s = R.randint(-1, 6); segs.append({"kind": R.choice(KINDS[:8] + [None]), "payload": payload("text"), **({"span": R.choice([[s, s + R.randint(-1, 3)], [s]])} if R.random() < 0.6 else {}), **({"author": "p"} if R.random() < .2 else {})})
    if R.random() < 0.05: segs.append("notmap")
    traj = {"prompt_ids": R.choice([[], [1, 2, 3], None]), "completion_ids": comp, "logprobs": R.choice([None, [-0.5] * len(comp)]),
            "segments": segs, "reward": R.choice([None, 1.0, 0]), "rewards": R.choice([None, None, [1.0, {"value": 0.2, "scope": "turn", "source": "j", "author": "x"}]]),
            "prompt": R.choice([None, "Q?", {"m": 1}]), "task": R.choice([None, "T"]), "system_prompt": R.choice([None, "S"]), "task_id": R.choice([None, "id"]),
            "metadata": R.choice([None, {"k": 1}]), "id": R.choice([None, "tid"])}
    cmp("from_traj", lambda m: m.EventLog.from_trajectory(copy.deepcopy(traj)))
    cmp("from_traj_sft", lambda m: m.EventLog.from_trajectory(copy.deepcopy(traj)).as_dataset_rows())
    cmp("from_traj_mask", lambda m: m.EventLog.from_trajectory(copy.deepcopy(traj)).masked_tokens())
    # from_pipeline_state
    steps = []
    for _ in range(R.randint(0, 5)):
        st = {R.choice(["stage_id", "stage"]): R.choice(["extract", "check", 3]), R.choice(["stage_type", "type"]): R.choice(["tool_call", "rules", "router", "human_review", "llm", ""]),
              "output": jv(1)}
        for k in R.sample(["tool", "args", "arguments", "error", "status", "score"], R.randint(0, 3)):
            st[k] = {"tool": "sanctions", "args": {"n": 1}, "arguments": {"m": 2}, "error": R.choice(["bad", "", None]), "status": R.choice(["error", "ok"]), "score": R.choice([0.5, None, "x"])}[k]
        steps.append(st)
    if R.random() < 0.05: steps.append(5)
    state = {"input_text": R.choice([None, "in", 4]), "step_history": steps, "verdict": R.choice([None, {}, {"label": "ok", "confidence": 0.9}, {"label": "no"}]),
             "template_id": R.choice([None, "kyc"]), "run_id": R.choice([None, "r1"]), "task": R.choice([None, "t"])}
    cmp("from_pipe", lambda m: m.EventLog.from_pipeline_state(copy.deepcopy(state)))
    cmp("from_pipe_audit", lambda m: m.EventLog.from_pipeline_state(copy.deepcopy(state)).to_audit_records())
    cmp("from_pipe_eval", lambda m: m.EventLog.from_pipeline_state(copy.deepcopy(state)).to_eval_dict())
    # Event API
    pos = [0]; edict = event_dict(pos)
    cmp("event_from_dict", lambda m: m.Event.from_dict(copy.deepcopy(edict)))
    cmp("event_replace", lambda m: m.Event.from_dict(copy.deepcopy(edict)).replace(author="policy"))
    cmp("event_replace_bad", lambda m: m.Event.from_dict(copy.deepcopy(edict))._replace(colour=1))
    cmp("event_is_error", lambda m: m.Event.from_dict(copy.deepcopy(edict)).is_error)
    cmp("event_direct", lambda m: m.Event(edict["kind"], edict["payload"], token_span=edict.get("token_span"), logprobs=edict.get("logprobs"), scope=edict.get("scope"), author=edict.get("author")))
    cmp("kind_parse", lambda m: m.EventKind.parse(edict["kind"]))
    cmp("render", lambda m: m.render_tool_call(edict["payload"]) if isinstance(edict["payload"], dict) else None)
    cmp("fold", lambda m: m.fold_tool_stage("x", edict["payload"]))
cmp("consts", lambda m: ([] if args.ignore_all else m.__all__, m.REWARD_SCOPES, m.TIERS, sorted(k.value for k in m.AGENT_KINDS), {k.value: v for k, v in m.SEGMENT_WEIGHTS.items()}, {k.value: v for k, v in m.SEGMENT_ROLES.items()}))
print(f"cases {N}, ops {ops}, diffs {len(diffs)}")
for d in diffs[:8]:
    print(str(d)[:600])
sys.exit(1 if diffs else 0)
