"""The EventLog contract: kinds, validation, the six projections and the four schema properties."""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agenttune_lib.events import (
    SEGMENT_ROLES,
    SEGMENT_WEIGHTS,
    Event,
    EventKind,
    EventLog,
    EventLogError,
    _event_content,
    fold_tool_stage,
)

# ---------------------------------------------------------------- strategies
_text = st.text(min_size=0, max_size=12)
_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), _text)
_args = st.dictionaries(st.text(min_size=1, max_size=6), _json_scalar, max_size=3)


@st.composite
def events(draw, with_tokens: bool = False):
    kind = draw(st.sampled_from(list(EventKind)))
    if kind is EventKind.TOOL_CALL:
        payload = {"name": draw(st.sampled_from(["search", "lookup", "calc"])), "arguments": draw(_args)}
    elif kind is EventKind.TOOL_RESULT:
        payload = {"name": "search", "content": draw(_text)}
        if draw(st.booleans()):
            payload["error"] = draw(st.text(min_size=1, max_size=8))
    elif kind is EventKind.REWARD:
        payload = {"value": draw(st.floats(-5, 5, allow_nan=False))}
    elif kind is EventKind.MEMORY_OP:
        payload = {"op": draw(st.sampled_from(["store", "recall"])), "content": draw(_text)}
    elif kind is EventKind.TURN_COMPLETE:
        payload = {}
    else:
        payload = {"content": draw(_text)}
    scope = draw(st.sampled_from(["step", "turn", "episode"])) if kind is EventKind.REWARD else None
    author = draw(st.one_of(st.none(), st.sampled_from(["policy", "judge_a"])))
    return kind, payload, scope, author


@st.composite
def event_logs(draw, tier: str | None = None):
    tier = tier or draw(st.sampled_from(["light", "full"]))
    specs = draw(st.lists(events(), min_size=0, max_size=12))
    built, cursor = [], 0
    for kind, payload, scope, author in specs:
        span = lps = None
        if tier == "full" and kind not in (EventKind.REWARD, EventKind.TURN_COMPLETE):
            n = draw(st.integers(0, 4))
            span = (cursor, cursor + n)
            lps = [-0.5] * n
            cursor += n
        built.append(Event(kind, payload, token_span=span, logprobs=lps, scope=scope, author=author))
    token_ids = list(range(cursor)) if tier == "full" else None
    return EventLog(built, tier=tier, metadata={"task": "t"}, token_ids=token_ids)


# ---------------------------------------------------------------- basics
def test_exactly_eight_kinds():
    assert [k.name for k in EventKind] == [
        "TEXT", "REASONING", "TOOL_CALL", "TOOL_RESULT", "OBSERVATION", "TURN_COMPLETE", "REWARD", "MEMORY_OP",
    ]


def test_event_fields_and_defaults():
    ev = Event(EventKind.TEXT, {"content": "hi"})
    assert (ev.token_span, ev.logprobs, ev.scope, ev.author) == (None, None, None, None)
    ev = Event("reward", {"value": 1}, scope="turn", author="judge")
    assert ev.kind is EventKind.REWARD and ev.scope == "turn" and ev.author == "judge"


def test_log_is_ordered_iterable_sized():
    evs = [Event(EventKind.TEXT, {"content": str(i)}) for i in range(5)]
    log = EventLog(evs, id="x", metadata={"a": 1})
    assert len(log) == 5 and list(log) == evs and log.id == "x" and log.metadata == {"a": 1} and log.tier == "light"


@pytest.mark.parametrize("tier", ["heavy", "", None, "FULL"])
def test_tier_is_validated(tier):
    with pytest.raises(ValueError, match="tier"):
        EventLog([], tier=tier)


def test_bad_events_name_their_index():
    ok = Event(EventKind.TEXT, {"content": "a"})
    with pytest.raises(EventLogError, match=r"event 1: unknown event kind 'shout'"):
        EventLog([ok, {"kind": "shout", "payload": {}}])
    with pytest.raises(EventLogError, match=r"event 2: REWARD needs scope"):
        EventLog([ok, ok, {"kind": "reward", "payload": {"value": 1.0}}])
    with pytest.raises(EventLogError, match=r"event 1: REWARD needs scope"):
        EventLog([ok, {"kind": "reward", "payload": {"value": 1.0}, "scope": "lifetime"}])
    with pytest.raises(EventLogError, match=r"event 1: payload.content holds a object, which is not JSON"):
        EventLog([ok, {"kind": "text", "payload": {"content": object()}}])
    with pytest.raises(EventLogError, match=r"event 1: token_span \(2, 9\) is outside the sequence of 4 tokens"):
        EventLog([ok, Event(EventKind.TEXT, {}, token_span=(2, 9))], tier="full", token_ids=[1, 2, 3, 4])
    with pytest.raises(EventLogError, match=r"event 0: token_span"):
        EventLog([{"kind": "text", "payload": {}, "token_span": [5, 2]}])


def test_scope_only_for_reward():
    with pytest.raises(EventLogError, match="scope is meaningful for REWARD only"):
        Event(EventKind.TEXT, {"content": "x"}, scope="step")


# ---------------------------------------------------------------- projections
def _full_log() -> EventLog:
    return EventLog(
        [
            Event(EventKind.OBSERVATION, {"content": "Find the termination clause."}, token_span=(0, 5)),
            Event(EventKind.REASONING, {"content": "I should search."}, token_span=(5, 8), logprobs=[-0.1, -0.2, -0.3]),
            Event(EventKind.TOOL_CALL, {"name": "search", "arguments": {"q": "termination", "k": 3}, "id": "c1"}, token_span=(8, 12), logprobs=[-1] * 4),
            Event(EventKind.TOOL_RESULT, {"name": "search", "content": "Section 9 ...", "id": "c1"}, token_span=(12, 20)),
            Event(EventKind.MEMORY_OP, {"op": "store", "content": "section 9"}, token_span=(20, 22)),
            Event(EventKind.TEXT, {"content": "Section 9."}, token_span=(22, 25), logprobs=[-0.5] * 3),
            Event(EventKind.TURN_COMPLETE, {}),
            Event(EventKind.REWARD, {"value": 1.0}, scope="episode"),
        ],
        tier="full",
        token_ids=list(range(25)),
    )


def test_sft_projection_weights_roles_and_mask_polarity():
    (row,) = _full_log().as_dataset_rows("sft")
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["user", "assistant", "assistant", "tool", "user", "assistant"]
    assert row["segment_weights"] == [0.0, 1.0, 2.0, 0.0, 0.0, 1.0]
    assert row["loss_mask"] == [True, False, False, True, True, False]
    call = row["messages"][2]["content"]
    assert call.startswith("<tool_call>") and call.endswith("</tool_call>")
    assert json.loads(call[len("<tool_call>"):-len("</tool_call>")]) == {"name": "search", "arguments": {"k": 3, "q": "termination"}}
    assert "memory" in row["messages"][4]["content"]


def test_full_only_operations_raise_on_light():
    light = EventLog([Event(EventKind.TEXT, {"content": "x"})])
    with pytest.raises(ValueError, match="full"):
        light.as_dataset_rows("sft")
    with pytest.raises(ValueError, match="full"):
        light.masked_tokens()
    assert light.to_eval_dict()["final_answer"] == "x"
    assert light.rewards() == []


def test_masked_tokens_are_agent_spans():
    assert _full_log().masked_tokens() == [(5, 8), (8, 12), (22, 25)]


def test_rewards_by_scope():
    log = EventLog(
        [Event("reward", {"value": 0.5}, scope="step"), Event("reward", {"value": 1.0}, scope="episode"), Event("reward", {"value": -1}, scope="step")]
    )
    assert log.rewards() == [0.5, 1.0, -1.0]
    assert log.rewards("step") == [0.5, -1.0]
    assert log.rewards("episode") == [1.0]
    with pytest.raises(ValueError):
        log.rewards("forever")


def test_audit_records_fold_tool_and_args_and_mark_errors():
    log = EventLog(
        [
            Event(EventKind.TOOL_CALL, {"name": "kyc_lookup", "arguments": {"b": 2, "a": 1}}),
            Event(EventKind.TOOL_RESULT, {"name": "kyc_lookup", "error": {"type": "Timeout", "message": "slow"}}),
            Event(EventKind.TOOL_CALL, {"name": "kyc_lookup", "arguments": {"a": 1, "b": 2}}),
            Event(EventKind.TOOL_RESULT, {"name": "kyc_lookup", "content": "ok"}),
            Event(EventKind.TOOL_CALL, {"name": "kyc_lookup", "arguments": {"a": 1, "b": 3}}),
        ],
        id="t1",
    )
    records = log.to_audit_records()
    assert [r["stage"] for r in records] == ['kyc_lookup({"a":1,"b":2})'] * 2 + ['kyc_lookup({"a":1,"b":3})']
    assert [r["status"] for r in records] == ["error", "ok", "ok"]
    assert records[0]["error"] == {"type": "Timeout", "message": "slow"}
    assert all(r["trajectory_id"] == "t1" for r in records)
    assert fold_tool_stage("x", {"b": 1, "a": 2}) == 'x({"a":2,"b":1})'


def test_eval_dict_round_trip_and_shape():
    log = _full_log()
    d = log.to_eval_dict()
    assert [c["name"] for c in d["tool_calls"]] == ["search"]
    assert d["tool_outputs"][0]["error"] is None
    assert d["final_answer"] == "Section 9."
    back = EventLog.from_eval_dict(d)
    assert back.tier == "light"
    assert [(e.kind, e.payload, e.scope) for e in back] == [(e.kind, e.payload, e.scope) for e in log]


def test_from_trajectory_builds_full_tier_with_absolute_spans():
    traj = {
        "prompt": "What is 2+2?",
        "prompt_ids": [1, 2, 3],
        "completion_ids": [4, 5, 6, 7, 8],
        "logprobs": [-0.1, -0.2, -0.3, -0.4, -0.5],
        "segments": [
            {"kind": "tool_call", "payload": {"name": "calc", "arguments": {"e": "2+2"}}, "span": [0, 3]},
            {"kind": "tool_result", "payload": {"name": "calc", "content": "4"}},
            {"kind": "text", "payload": {"content": "4"}, "span": [3, 5], "author": "policy"},
        ],
        "reward": 1.0,
    }
    frozen = copy.deepcopy(traj)
    log = EventLog.from_trajectory(traj)
    assert traj == frozen
    assert log.tier == "full" and log.token_ids == (1, 2, 3, 4, 5, 6, 7, 8)
    assert log.masked_tokens() == [(3, 6), (6, 8)]
    assert log[1].logprobs == (-0.1, -0.2, -0.3)
    assert log.rewards("episode") == [1.0]
    with pytest.raises(EventLogError, match="outside the completion"):
        EventLog.from_trajectory({**traj, "segments": [{"kind": "text", "payload": {}, "span": [2, 9]}]})


def test_from_pipeline_state_reads_decide_state():
    state = {
        "run_id": "r1",
        "template_id": "kyc_triage",
        "input_text": "Customer X",
        "step_history": [
            {"stage_id": "extract", "stage_type": "llm_call", "output": {"name": "X"}},
            {"stage_id": "lookup", "stage_type": "tool_call", "tool": "sanctions", "args": {"name": "X"}, "output": None, "error": "timeout"},
            {"stage_id": "check", "stage_type": "rules", "output": {"passed": False}},
        ],
        "verdict": {"label": "escalate", "confidence": 0.7, "reason": "tool failed"},
    }
    frozen = copy.deepcopy(state)
    log = EventLog.from_pipeline_state(state)
    assert state == frozen
    assert log.tier == "light" and log.id == "r1"
    kinds = [e.kind for e in log]
    assert kinds == [EventKind.OBSERVATION, EventKind.TEXT, EventKind.TOOL_CALL, EventKind.TOOL_RESULT, EventKind.REASONING, EventKind.TEXT, EventKind.REWARD, EventKind.TURN_COMPLETE]
    records = log.to_audit_records()
    assert [r["stage"] for r in records] == ["input", "extract", 'sanctions({"name":"X"})', "check", "verdict"]
    assert records[2]["status"] == "error"


def test_token_rows_align_loss_with_chat_template(tiny_tokenizer):
    from agenttune_lib.models.chat_tokens import token_rows

    (row,) = token_rows(_full_log(), tiny_tokenizer)
    ids, mask, weights = row["input_ids"], row["completion_mask"], row["token_weights"]
    assert len(ids) == len(mask) == len(weights) > 0
    trained = tiny_tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert "search" in trained and "Section 9." in trained and "I should search." in trained
    assert "Section 9 ..." not in trained and "Find the termination clause." not in trained
    assert "<|im_start|>assistant" not in trained
    assert set(weights) == {0.0, 1.0, 2.0}


def test_serialization_round_trip():
    log = _full_log()
    assert EventLog.from_json(log.to_json()) == log


# ---------------------------------------------------------------- the four properties of §3.3.4
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(event_logs())
def test_order_preservation(log):
    kinds = [e.kind.value for e in log]
    assert [s["kind"] for s in log.to_eval_dict()["steps"]] == kinds
    seqs = [r["seq"] for r in log.to_audit_records()]
    assert seqs == sorted(seqs)
    assert all(log[r["seq"]].kind.value == r["kind"] and EventLog._stage_name(log[r["seq"]]) == r["stage"] for r in log.to_audit_records())
    if log.tier == "full":
        (row,) = log.as_dataset_rows("sft")
        expected = [e for e in log if e.kind in SEGMENT_WEIGHTS]
        messages = row["messages"][len(row["messages"]) - len(expected):]
        assert len(row["messages"]) - (1 if log.metadata.get("task") and not (kinds and kinds[0] == "observation") else 0) == len(expected)
        # order, not only count: the i-th message is the i-th weighted event's role and rendered content
        assert [(m["role"], m["content"]) for m in messages] == [(SEGMENT_ROLES[e.kind], _event_content(e.kind, e.payload)) for e in expected]


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(event_logs(tier="full"))
def test_tier_monotonicity(log):
    light = EventLog(
        [Event(e.kind, e.payload, scope=e.scope, author=e.author) for e in log], tier="light", id=log.id, metadata=log.metadata
    )
    assert log.to_eval_dict()["steps"] == light.to_eval_dict()["steps"]
    assert log.to_audit_records() == light.to_audit_records()
    assert log.rewards() == light.rewards()
    log.as_dataset_rows("sft")
    log.masked_tokens()


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(event_logs(tier="full"))
def test_weight_partition(log):
    (row,) = log.as_dataset_rows("sft")
    assert len(row["messages"]) == len(row["segment_weights"]) == len(row["loss_mask"])
    assert all(w in (0.0, 1.0, 2.0) for w in row["segment_weights"])
    assert row["loss_mask"] == [w == 0.0 for w in row["segment_weights"]]
    for message, w in zip(row["messages"], row["segment_weights"]):
        assert (message["role"] == "assistant") == (w > 0.0)
    spans = log.masked_tokens()
    flat = [i for s, e in spans for i in range(s, e)]
    assert len(flat) == len(set(flat))


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(event_logs())
def test_read_only_sources(log):
    eval_dict = log.to_eval_dict()
    frozen = copy.deepcopy(eval_dict)
    rebuilt = EventLog.from_eval_dict(eval_dict)
    assert eval_dict == frozen
    for event in rebuilt:
        event.payload["mutated"] = True
    assert eval_dict == frozen
    traj = {"prompt_ids": [1], "completion_ids": [2, 3], "segments": [{"kind": "text", "payload": {"content": "a"}, "span": [0, 2]}]}
    frozen_traj = copy.deepcopy(traj)
    EventLog.from_trajectory(traj)[0].payload["x"] = 1
    assert traj == frozen_traj


# ---------------------------------------------------------------- the contract on the way in
_non_str_key = st.one_of(st.integers(-5, 5), st.booleans(), st.floats(-2, 2, allow_nan=False), st.none())


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(key=_non_str_key, nested=st.booleans())
def test_payloads_with_non_string_keys_are_rejected(key, nested):
    payload = {"content": "x", "meta": {key: 1}} if nested else {key: "x"}
    where = "payload.meta" if nested else "payload"
    with pytest.raises(EventLogError, match=rf"{where} has a {type(key).__name__} key .*would not round-trip"):
        Event(EventKind.TEXT, payload)
    with pytest.raises(EventLogError, match=r"metadata has a .* key"):
        EventLog([], metadata={key: 1})


def test_payloads_that_would_not_round_trip_are_rejected():
    with pytest.raises(EventLogError, match=r"payload.arguments.path is a tuple: JSON gives back a list"):
        Event(EventKind.TOOL_CALL, {"name": "f", "arguments": {"path": ("a", "b")}})
    with pytest.raises(EventLogError, match=r"payload.x\[1\] is nan"):
        Event(EventKind.TEXT, {"x": [1.0, float("nan")]})
    with pytest.raises(EventLogError, match=r"payload.n is an integer beyond 64 bits"):
        Event(EventKind.TEXT, {"n": 2**70})
    with pytest.raises(EventLogError, match=r"payload.s holds a set"):
        Event(EventKind.TEXT, {"s": {1, 2}})
    ok = Event(EventKind.TEXT, {"content": "a", "n": [1, 2.5, None, True, {"k": "v"}]})
    log = EventLog([ok], metadata={"plan": ["a", {"b": 1}]})
    assert EventLog.from_json(log.to_json()) == log


def test_token_spans_must_be_in_order_and_disjoint():
    text = lambda span: Event(EventKind.TEXT, {}, token_span=span)  # noqa: E731
    EventLog([text((0, 2)), text((2, 2)), text((2, 5))], tier="full", token_ids=list(range(6)))
    with pytest.raises(EventLogError, match=r"event 1: token_span \(1, 3\) overlaps or precedes the previous span ending at 2"):
        EventLog([text((0, 2)), text((1, 3))], tier="full", token_ids=list(range(6)))
    with pytest.raises(EventLogError, match=r"event 2: token_span \(0, 1\) overlaps or precedes"):
        EventLog([text((2, 3)), Event(EventKind.REWARD, {"value": 1}, scope="step"), text((0, 1))], tier="full", token_ids=list(range(6)))


def test_payload_check_fast_path_keeps_the_walkers_verdicts():
    # _json_value checks in C first (orjson dump + reload + compare) and hands anything else to the walker:
    # the stored copy is plain JSON, private to the event, and the walker's accept/reject verdicts stand.
    import dataclasses as dc
    import datetime

    class Tag(str):
        pass

    @dc.dataclass
    class Point:
        x: int

    payload = {"s": "x", "n": [1, 2.5, True, None, 2**64 - 1, -(2**63)], "d": {"k": [{"z": -0.0}]}}
    ev = Event(EventKind.TEXT, payload)
    assert ev.payload == payload and type(ev.payload["n"][2]) is bool and type(ev.payload["n"][1]) is float
    payload["d"]["k"][0]["z"] = 1
    assert ev.payload["d"]["k"][0]["z"] == 0.0  # a private deep copy
    assert Event(EventKind.TEXT, {"t": Tag("a")}).payload == {"t": "a"}  # str subclass: the walker accepts it
    assert Event(EventKind.TEXT, {"u": "\ud800"}).payload == {"u": "\ud800"}  # lone surrogate: orjson refuses, the walker accepts
    for bad, message in (
        ({"p": Point(1)}, r"payload.p holds a Point"),
        ({"t": datetime.date(2026, 1, 1)}, r"payload.t holds a date"),
        ({"x": [float("inf")]}, r"payload.x\[0\] is inf"),
        ({"x": {"y": (1,)}}, r"payload.x.y is a tuple"),
        ({"n": -(2**63) - 1}, r"payload.n is an integer beyond 64 bits"),
    ):
        with pytest.raises(EventLogError, match=message):
            Event(EventKind.TEXT, bad)


def test_projection_outputs_are_private_copies():
    # to_eval_dict and to_audit_records copy all payloads in one C call; every nested value a caller can
    # reach must still be its own: mutating the output leaves the log alone and the other way round.
    log = EventLog(
        [
            Event(EventKind.TOOL_CALL, {"name": "f", "arguments": {"q": ["a"]}, "id": "c1"}),
            Event(EventKind.TOOL_RESULT, {"name": "f", "content": {"rows": [1]}, "error": {"code": 1}, "id": "c1"}),
            Event(EventKind.TEXT, {"content": "done"}),
        ],
        metadata={"task": "t", "plan": ["s1"], "extra": {"k": [1]}},
    )
    before = log.to_dict()
    d, records = log.to_eval_dict(), log.to_audit_records()
    d["steps"][0]["payload"]["arguments"]["q"].append("x")
    d["tool_calls"][0]["arguments"]["q"].append("y")
    d["tool_outputs"][0]["error"]["code"] = 2
    d["plan"].append("s2")
    d["metadata"]["extra"]["k"].append(2)
    records[0]["state"]["arguments"]["q"].append("z")
    records[0]["state"]["result"]["content"]["rows"].append(2)
    records[0]["error"]["code"] = 3
    assert log.to_dict() == before
    assert d["steps"][0]["payload"]["arguments"]["q"] == ["a", "x"] and d["tool_calls"][0]["arguments"]["q"] == ["a", "y"]
    assert records[0]["state"]["result"]["error"] == {"code": 1}
    d2, records2 = log.to_eval_dict(), log.to_audit_records()
    log[0].payload["arguments"]["q"].append("w")
    log.metadata["plan"].append("s9")
    assert d2["tool_calls"][0]["arguments"]["q"] == ["a"] and d2["plan"] == ["s1"]
    assert records2[0]["state"]["arguments"]["q"] == ["a"]


def test_from_json_reads_integers_beyond_64_bits_exactly():
    # from_json parses with orjson, which reads an integer beyond 64 bits as a float: such text goes to json,
    # so the integer reaches validation (and is refused) instead of silently becoming a float.
    text = '{"id": "a", "events": [{"kind": "text", "payload": {"n": 123456789012345678901}}]}'
    with pytest.raises(EventLogError, match=r"payload.n is an integer beyond 64 bits"):
        EventLog.from_json(text)
    ok = EventLog.from_json('{"id": "a", "events": [{"kind": "text", "payload": {"n": 18446744073709551615, "s": "1234567890123456789012"}}]}')
    assert ok[0].payload == {"n": 18446744073709551615, "s": "1234567890123456789012"}


def test_an_event_is_an_immutable_value():
    import pickle

    ev = Event(EventKind.TOOL_CALL, {"name": "f", "arguments": {"q": 1}}, token_span=(0, 2), logprobs=[-0.5, -0.25])
    with pytest.raises(AttributeError):
        ev.payload = {}  # type: ignore[misc]
    with pytest.raises(AttributeError):
        ev.extra = 1  # type: ignore[attr-defined]
    assert ev == Event(EventKind.TOOL_CALL, {"name": "f", "arguments": {"q": 1}}, token_span=(0, 2), logprobs=[-0.5, -0.25])
    assert ev != dataclasses.astuple(ev) and ev.logprobs == (-0.5, -0.25)
    assert pickle.loads(pickle.dumps(ev)) == ev and copy.deepcopy(ev) == ev
    assert ev._replace(author="policy").author == "policy"
    with pytest.raises(EventLogError, match="scope is meaningful for REWARD only"):
        ev._replace(scope="episode")  # a replaced Event is validated like any other
    with pytest.raises(EventLogError, match="payload.x is a tuple"):
        Event(*[EventKind.TEXT, {"x": (1,)}, None, None, None, None])
    with pytest.raises(TypeError, match="no field"):
        ev._replace(colour="red")
    assert dataclasses.replace(ev, author="judge").author == "judge"  # the dataclass protocol still works on an Event
    assert dataclasses.asdict(ev)["token_span"] == (0, 2) and [f.name for f in dataclasses.fields(Event)][:2] == ["kind", "payload"]
