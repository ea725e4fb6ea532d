"""The full-tier record is what the model saw and said, for every strategy; pairs share one context."""
from __future__ import annotations

import json

import pytest

from agenttune_lib.events import EventKind
from agenttune_lib.models.tiny import build_tiny_tokenizer
from agenttune_lib.spine import (
    DictToolHarness,
    Generation,
    MemoryReActStrategy,
    PlanExecuteStrategy,
    ReActStrategy,
    ReflexionStrategy,
    TreeOfThoughtsStrategy,
    preference_pairs,
    run_episode,
    run_reflexion,
)
from agenttune_lib.spine.memory import InContextMemory, MemoryItem
from agenttune_lib.spine.record import check_token_record, messages_digest, rejected_logs, turn_context
from _spine_helpers import TASK, add, mul


# Non-canonical spacing and trailing text: a re-rendered conversation differs from these completions,
# so splicing a re-rendered prompt onto the sequence would corrupt it.
ADD = '<tool_call>{"name":"add",  "arguments":{"a":2,"b":3}}</tool_call>  '
MUL = '<tool_call>{"name":"mul","arguments":{"a":5, "b":4}}</tool_call>\n'
BAD_MUL = '<tool_call>{"name":"mul","arguments":{"a":2,"b":3}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


class TokenModel:
    """Test fake of a token-reporting model: renders the chat template, tokenizes, returns a Generation."""

    def __init__(self, tokenizer, rule):
        self.tokenizer, self.rule, self.calls = tokenizer, rule, []

    def __call__(self, messages):
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        reply = self.rule(messages)
        completion_ids = list(self.tokenizer(reply, add_special_tokens=False)["input_ids"])
        logprobs = [-0.01 * (i + 1) - 0.001 * len(self.calls) for i in range(len(completion_ids))]
        self.calls.append({"digest": messages_digest(messages), "messages": messages, "prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs, "text": reply})
        return Generation(reply, prompt_ids, completion_ids, logprobs)


def arithmetic(messages):
    system = messages[0]["content"]
    if system.startswith("You review a failed attempt"):
        return "Compute with the tools first."
    last = messages[-1]
    if "complete plan" in system and last["role"] == "user":
        return ADD + MUL
    if last["role"] == "user":
        return ADD
    if last["content"] == "5":
        return MUL
    return "The answer is 20."


def _all_logs(log):
    return [log, *rejected_logs(log)]


def assert_faithful(log, model, tokenizer):
    assert log.tier == "full"
    ids = list(log.token_ids)
    turns = log.metadata["turns"]
    assert turns, "no model turn was recorded"
    assert check_token_record(log, tokenizer) == []
    for turn in turns:
        fed = [c for c in model.calls if c["digest"] == turn["context_sha256"] and c["text"] == turn["text"]]
        assert fed, f"turn at prefix {turn['prefix_len']} does not match any call the model received"
        call = fed[0]
        p0, p1 = turn["prompt_span"]
        c0, c1 = turn["completion_span"]
        assert ids[p0:p1] == call["prompt_ids"]  # exactly what was fed to generate
        assert ids[c0:c1] == call["completion_ids"]  # exactly what it produced
        event = log.events[turn["event"]]
        assert event.token_span == (c0, c1) and list(event.logprobs) == call["logprobs"]
        assert turn_context(log, turn) == call["messages"]
        # re-tokenizing the conversation rebuilt from the log gives the recorded prompt
        text = tokenizer.apply_chat_template(turn_context(log, turn), tokenize=False, add_generation_prompt=True)
        assert list(tokenizer(text, add_special_tokens=False)["input_ids"]) == ids[p0:p1]


def _harness(**kw):
    return DictToolHarness({"add": add, "mul": mul}, **kw)


def _run(kind, model):
    if kind == "react":
        return run_episode(ReActStrategy(model), _harness(), TASK)
    if kind == "plan_execute":
        return run_episode(PlanExecuteStrategy(model), _harness(), TASK)
    if kind == "memory_react":
        memory = InContextMemory()
        memory.add(MemoryItem("add first, then multiply"))
        return run_episode(MemoryReActStrategy(model, memory), _harness(), TASK)
    if kind == "reflexion":
        def wrapped(messages):
            return model(messages)

        strategy = ReflexionStrategy(wrapped, max_attempts=3)
        return run_reflexion(strategy, _harness(), TASK)
    if kind == "tot_greedy":
        return run_episode(TreeOfThoughtsStrategy(model, n_candidates=2), _harness(), TASK)
    if kind == "tot_search":
        return TreeOfThoughtsStrategy(model, n_candidates=2, max_steps=4).search(_harness(), TASK)
    raise AssertionError(kind)


STRATEGIES = ["react", "plan_execute", "memory_react", "reflexion", "tot_greedy", "tot_search"]


def _rule_for(kind):
    if kind == "reflexion":
        def rule(messages):
            system = messages[0]["content"]
            if system.startswith("You review a failed attempt"):
                return "Compute with the tools first."
            if "Lessons from your earlier" not in system:
                return "It is 19."
            return arithmetic(messages)

        return rule
    if kind in ("tot_greedy", "tot_search"):
        first = [BAD_MUL, ADD] if kind == "tot_search" else ['<tool_call>{"name": "nope", "arguments": {}}</tool_call>', ADD]

        def rule(messages):
            last = messages[-1]
            if last["role"] == "user":
                return first.pop(0) if first else ADD
            if last["content"] == "6":
                return "It is 6."
            return arithmetic(messages)

        return rule
    return arithmetic


@pytest.mark.parametrize("kind", STRATEGIES)
def test_recorded_tokens_are_what_the_model_consumed_and_produced(kind, tokenizer):
    model = TokenModel(tokenizer, _rule_for(kind))
    log = _run(kind, model)
    assert log.rewards("episode") == [1.0]
    for one in _all_logs(log):
        assert_faithful(one, model, tokenizer)
    # Nothing spliced: the ids hold no run of tokens the model neither consumed nor produced.
    covered = set()
    for turn in log.metadata["turns"]:
        covered.update(range(*turn["prompt_span"]))
        covered.update(range(*turn["completion_span"]))
    assert covered == set(range(len(log.token_ids)))


def test_a_non_prefix_stable_prompt_opens_a_new_segment_instead_of_splicing(tokenizer):
    model = TokenModel(tokenizer, arithmetic)
    log = run_episode(ReActStrategy(model), _harness(), TASK)
    first, second = log.metadata["turns"][:2]
    # The second prompt re-renders the first call canonically, so it is not the first prompt + completion...
    assert model.calls[1]["prompt_ids"][: first["completion_span"][1]] != list(log.token_ids[: first["completion_span"][1]])
    # ...and the record keeps it whole, in its own segment.
    assert second["prompt_span"][0] == first["completion_span"][1]
    decoded = tokenizer.decode(log.token_ids, skip_special_tokens=False)
    assert "</tool_call>3}}</tool_call>" not in decoded and decoded.count(ADD.strip()) == 1


def test_prefix_stable_prompts_share_the_sequence(tokenizer):
    # A model whose next prompt extends the last one exactly: the shared prefix is stored once.
    gen_calls = []

    def model(messages):
        prompt = [1, 2, 3] if not gen_calls else gen_calls[-1][0] + gen_calls[-1][1] + [9]
        completion = [4, 5] if not gen_calls else [6]
        gen_calls.append((prompt, completion))
        text = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>' if len(gen_calls) == 1 else "20"
        return Generation(text, prompt, completion, [-0.5] * len(completion))

    log = run_episode(ReActStrategy(model), _harness(), TASK)
    assert list(log.token_ids) == [1, 2, 3, 4, 5, 9, 6]
    assert [t["prompt_span"] for t in log.metadata["turns"]] == [[0, 3], [0, 6]]
    assert [t["completion_span"] for t in log.metadata["turns"]] == [[3, 5], [6, 7]]


def test_plain_text_models_stay_light_tier_with_turn_texts():
    log = run_episode(ReActStrategy(lambda m: arithmetic(m)), _harness(), TASK)
    assert log.tier == "light" and log.token_ids is None
    assert [t["text"] for t in log.metadata["turns"]] == [ADD, MUL, "The answer is 20."]
    assert check_token_record(log) == []


def test_generation_rejects_misaligned_logprobs():
    with pytest.raises(ValueError, match="logprobs has 1 values for 2 completion_ids"):
        Generation("x", [1], [2, 3], [-0.1])


@pytest.mark.parametrize("kind", STRATEGIES)
def test_preference_pairs_come_from_one_context(kind, tokenizer):
    model = TokenModel(tokenizer, _rule_for(kind))
    log = _run(kind, model)
    pairs = preference_pairs(log)
    if kind in ("tot_greedy", "tot_search"):
        assert pairs, "tree-of-thoughts must yield pairs at branch points the kept path passed through"
    else:
        assert pairs == []  # no branch point shares a context with a kept continuation
    for pair in pairs:
        assert pair["same_context"] is True
        chosen, rejected = pair["chosen"][0]["content"], pair["rejected"][0]["content"]
        digest = messages_digest(pair["prompt"])
        # both continuations were generated, by the model, from exactly this prompt
        assert any(c["digest"] == digest and c["text"] == chosen for c in model.calls)
        assert any(c["digest"] == digest and c["text"] == rejected for c in model.calls)
    if kind == "tot_search":
        assert not any(p["rejected"][0]["content"] == "It is 6." for p in pairs)
        assert any(p["rejected"][0]["content"] == BAD_MUL and p["chosen"][0]["content"] == ADD for p in pairs)


def test_rejected_branches_are_linked_logs_with_their_own_context(tokenizer):
    model = TokenModel(tokenizer, _rule_for("tot_search"))
    log = _run("tot_search", model)
    branches = rejected_logs(log)
    assert branches and all(b.metadata["branch_of"] == log.id for b in branches)
    dead = next(b for b in branches if any(e.kind is EventKind.TEXT and e.payload.get("content") == "It is 6." for e in b))
    # the dead end's context is the mul(2, 3) path, not the kept path
    calls = [e.payload["arguments"] for e in dead.filter("tool_call")]
    assert calls == [{"a": 2, "b": 3}] and dead.filter("tool_call")[0].payload["name"] == "mul"
    assert json.loads(json.dumps(log.to_dict()))["metadata"]["rejected_branches"][0]["log"]["metadata"]["branch_of"] == log.id


def test_a_real_chat_generator_episode_is_recorded_faithfully():
    from agenttune_lib.models.generate import ChatGenerator
    from agenttune_lib.models.tiny import build_tiny_model

    model, tok = build_tiny_model()
    generator = ChatGenerator(model, tok, max_new_tokens=12, stop_strings=())
    fed = []

    def recording(messages):
        if not fed:
            # A scripted first turn, as the issue-12 teachers build it: the student tokenizer's ids for the call.
            prompt_ids = generator._prompt_ids(messages)
            completion_ids = list(tok(ADD, add_special_tokens=False)["input_ids"])
            gen = Generation(ADD, prompt_ids, completion_ids, None)
        else:
            gen = generator(messages)
        fed.append((messages_digest(messages), list(gen.prompt_ids), list(gen.completion_ids), gen.logprobs))
        return gen

    log = run_episode(ReActStrategy(recording, max_steps=3), _harness(max_steps=3), TASK)
    assert log.tier == "full" and check_token_record(log, tok) == []
    assert len(log.metadata["turns"]) >= 2 and log.filter("tool_result")[0].payload["content"] == "5"
    for turn in log.metadata["turns"]:
        digest, prompt, completion, logprobs = next(f for f in fed if f[0] == turn["context_sha256"])
        assert list(log.token_ids[slice(*turn["prompt_span"])]) == prompt
        assert list(log.token_ids[slice(*turn["completion_span"])]) == completion
        event = log.events[turn["event"]]
        assert (list(event.logprobs) if event.logprobs is not None else None) == (list(logprobs) if logprobs is not None else None)


def test_episode_problems_flags_a_tampered_record(tokenizer):
    from agenttune_lib.events import EventLog
    from agenttune_lib.spine.validate import episode_problems

    model = TokenModel(tokenizer, arithmetic)
    log = run_episode(ReActStrategy(model), _harness(), TASK)
    assert episode_problems([log]) == []
    data = log.to_dict()
    data["events"][0]["payload"]["content"] = "a different task"  # the context no longer rebuilds what the model saw
    problems = episode_problems([EventLog.from_dict(data)])
    assert any("do not rebuild the messages the model saw" in p["problem"] for p in problems)
