"""Rollout engines: the Table 15 contract, the tool loop, EventLog masks, distillation filtering."""
from __future__ import annotations

import pytest

from _rl_helpers import calculator, teacher_logs

from agenttune_lib.events import EventKind
from agenttune_lib.rl.rollout import ROLLOUT_KEYS, RolloutConfig, RolloutEngine, TransformersRolloutEngine


class ScriptedEngine(RolloutEngine):
    """Test double: replies from a script per turn, tokenized by the real tiny tokenizer."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.config, self.script, self.turn = tokenizer, RolloutConfig(max_tool_turns=2), script, 0

    def generate_texts(self, prompt_ids):
        out = [self.script[min(self.turn, len(self.script) - 1)]] * len(prompt_ids)
        self.turn += 1
        return out


def test_tool_loop_runs_tools_and_masks_their_results(tiny_model):
    _, tok = tiny_model
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    eng = ScriptedEngine(tok, [call, "The answer is 42."])
    out = eng.rollout(["What is 6*7?"], tools=[calculator], reward_fn="reward_correct_answer", answer=["42"])
    assert set(ROLLOUT_KEYS) <= set(out)
    assert out["tool_call_counts"] == [1] and out["rewards"] == [1.5] and out["responses"] == ["The answer is 42."]
    log = out["trajectories"][0]
    kinds = [e.kind for e in log.events]
    assert kinds == [EventKind.OBSERVATION, EventKind.TOOL_CALL, EventKind.TOOL_RESULT, EventKind.TEXT, EventKind.REWARD]
    result = log.events[2]
    assert result.payload["content"] == "42"
    # The log holds exactly the trainer's ids; tool-result tokens carry no loss, the sampled call does.
    p = len(out["prompt_ids"][0])
    assert list(log.token_ids) == out["prompt_ids"][0] + out["completion_ids"][0]
    mask = [0] * p + out["env_mask"][0]
    s, e = result.token_span
    assert e > s and not any(mask[s:e])
    s, e = log.events[1].token_span
    assert e > s and all(mask[s:e])
    assert sorted(log.masked_tokens()) == [log.events[1].token_span, log.events[3].token_span]
    assert sum(out["env_mask"][0]) == sum(e - s for s, e in log.masked_tokens())
    assert len(out["logprobs"][0]) == len(out["completion_ids"][0])


def test_malformed_and_unknown_calls_become_error_observations(tiny_model):
    _, tok = tiny_model
    eng = ScriptedEngine(tok, ['<tool_call>{"name": "calculator", "arguments": </tool_call>', '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "done"])
    log = eng.rollout(["x"], tools=[calculator])["trajectories"][0]
    errors = [e for e in log.events if e.is_error]
    assert [e.payload["error"]["type"] for e in errors] == ["parse_error", "unknown_tool"]


def test_transformers_engine_batches_real_generation(tiny_model):
    model, tok = tiny_model
    eng = TransformersRolloutEngine(model, tok, RolloutConfig(max_new_tokens=6, max_tool_turns=1))
    out = eng.rollout(["a", "b", "c"], tools=[calculator])
    assert len(out["completion_ids"]) == 3 and all(log.tier == "full" for log in out["trajectories"])
    assert out["rewards"] == [0.0, 0.0, 0.0]


def test_vllm_engine_without_vllm_says_how_to_install():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed")
    except ImportError:
        pass
    from agenttune_lib.rl.engines import create_rollout_engine

    with pytest.raises(ImportError, match=r"\[gpu\]"):
        create_rollout_engine("vllm", model_path="x")


def test_distillation_filter_drops_wrong_schema_and_ungrounded(tiny_model):
    from agenttune_lib.rl.distill import filter_teacher_trajectories, token_rows_dataset
    from agenttune_lib.rl.rollout import episode_to_eventlog

    _, tok = tiny_model
    good = teacher_logs(tok, 2)
    wrong, _ = episode_to_eventlog(tok, None, "What is 1+1?", [{"kind": "text", "payload": {"content": "It is 3."}}], metadata={"answer": "2"})
    schema, _ = episode_to_eventlog(tok, None, "q", [
        {"kind": "tool_call", "payload": {"name": "calculator", "arguments": {"x": 1}}},
        {"kind": "tool_result", "payload": {"name": "calculator", "content": "error", "error": {"type": "invalid_arguments", "message": "x"}}},
        {"kind": "text", "payload": {"content": "ok"}}])
    cite, _ = episode_to_eventlog(tok, None, "q", [
        {"kind": "tool_call", "payload": {"name": "search", "arguments": {"q": "a"}}},
        {"kind": "tool_result", "payload": {"name": "search", "content": "[doc:c1] text"}},
        {"kind": "text", "payload": {"content": "See [doc:c9]."}}])
    report = filter_teacher_trajectories(good + [wrong, schema, cite])
    assert [log.id for log in report.kept] == [log.id for log in good]
    assert report.counts == {"kept": 2, "wrong_final_answer": 1, "schema_error": 1, "ungrounded_citation": 1}
    ds = token_rows_dataset(report.kept, tok)
    assert set(ds.column_names) == {"input_ids", "completion_mask", "trajectory_id"}


def test_engine_speaks_the_spine_engine_protocol(tiny_model):
    from agenttune_lib.spine.project import engine_model

    model, tok = tiny_model
    eng = TransformersRolloutEngine(model, tok, RolloutConfig(max_new_tokens=5))
    gen = engine_model(eng)([{"role": "user", "content": "hi"}])
    assert isinstance(gen.text, str) and len(gen.logprobs) == len(gen.completion_ids)


def test_light_tier_teacher_logs_reproject_to_full_tier(tiny_model):
    from agenttune_lib.events import EventLog
    from agenttune_lib.rl.distill import as_full_tier

    _, tok = tiny_model
    light = EventLog([
        {"kind": "observation", "payload": {"content": "What is 2+2?"}},
        {"kind": "tool_call", "payload": {"name": "calculator", "arguments": {"expression": "2+2"}}},
        {"kind": "tool_result", "payload": {"name": "calculator", "content": "4"}},
        {"kind": "text", "payload": {"content": "4"}},
        {"kind": "reward", "payload": {"value": 1.0}, "scope": "episode"},
    ], metadata={"answer": "4"})
    full = as_full_tier(light, tok)
    assert full.tier == "full" and full.id == light.id and full.rewards("episode") == [1.0]
    assert [e.kind.value for e in full.events][:4] == ["observation", "tool_call", "tool_result", "text"]
    from agenttune_lib.models.chat_tokens import token_rows

    assert any(token_rows(full, tok)[0]["completion_mask"])
