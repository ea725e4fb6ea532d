"""Token faithfulness: the trainer's completion ids, loss mask and logprobs are exactly what generation sampled.

Covers GRPO, RLOO and PPO rollouts, a reply cut at the token limit, a multi-turn episode with a
tool result in between, and ``mask_truncated_completions`` on finished and truncated turns.
"""
from __future__ import annotations

import pytest

from _rl_helpers import calculator, length_reward

pytest.importorskip("trl")

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'


def _recording_engine(script_first_turn: dict[int, str]):
    """A TransformersRolloutEngine that records every Turn; prompts whose user text is in ``script_first_turn``
    get that reply as their first turn (rendered in the tokenizer, end-of-turn included), later turns sample."""
    from agenttune_lib.rl.rollout import TransformersRolloutEngine
    from agenttune_lib.rl.turns import Turn

    class Recording(TransformersRolloutEngine):
        turns: list = []

        def generate_turns(self, prompt_ids):
            out: list = [None] * len(prompt_ids)
            sample_idx = []
            for i, ids in enumerate(prompt_ids):
                text = self.tokenizer.decode(ids)
                scripted = next((reply for key, reply in script_first_turn.items() if f"user\nQ{key}?" in text and text.count("<|im_start|>assistant") == 1), None)
                if scripted is not None:
                    tok_ids = list(self.tokenizer(scripted, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]
                    out[i] = Turn(tok_ids, self.score_logprobs([ids], [tok_ids])[0], True, scripted)
                else:
                    sample_idx.append(i)
            if sample_idx:
                for i, t in zip(sample_idx, super().generate_turns([prompt_ids[i] for i in sample_idx])):
                    out[i] = t
            type(self).turns.extend(out)
            return out

    Recording.turns = []
    return Recording


def _dataset(n: int = 4):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Q{i}?"}]} for i in range(n)])


def _train_one_step(algo: str, monkeypatch, mask_truncated: bool = False, **extra):
    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl import build_value_model, create_agentic_trainer
    from agenttune_lib.rl import rollout as rollout_mod

    # Q0: a tool call, then a sampled (cut) reply; Q1: a finished direct answer; Q2/Q3: sampled, cut at 5 tokens.
    engine_cls = _recording_engine({0: CALL, 1: "The answer is 4."})
    monkeypatch.setattr(rollout_mod, "TransformersRolloutEngine", engine_cls)
    model, tok = build_tiny_model(seed=3)
    kw = dict(
        max_steps=1, per_device_train_batch_size=4, learning_rate=1e-2, num_generations=2, max_completion_length=5,
        reward_funcs=[length_reward], train_dataset=_dataset(2), tools=[calculator], mask_truncated_completions=mask_truncated,
    )
    if algo == "ppo":
        kw["value_model"] = build_value_model(model)
    kw.update(extra)
    trainer = create_agentic_trainer(algo, model=model, tokenizer=tok, **kw)
    captured = []
    orig = trainer._generate_and_score_completions

    def wrapped(inputs):
        out = orig(inputs)
        captured.append(out)
        return out

    trainer._generate_and_score_completions = wrapped
    trainer.train()
    return trainer, engine_cls.turns, captured[0], tok


@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo"])
def test_trainer_trains_on_exactly_the_sampled_ids(algo, monkeypatch):
    trainer, turns, out, tok = _train_one_step(algo, monkeypatch)
    eos = tok.eos_token_id
    rollout_fn = trainer.agenttune_rollout_func
    # Each trainer row is the concatenation of that episode's sampled turns and context ids; the loss
    # mask is 1 on exactly the sampled ids.
    ids, mask = out["completion_ids"], out["completion_mask"]
    loss_mask = mask * out["tool_mask"] if "tool_mask" in out else mask
    sampled_ids = [t.ids for t in turns]
    seen_multi_turn = seen_truncated = seen_finished = False
    for r in range(ids.shape[0]):
        row_ids, row_mask = ids[r].tolist(), loss_mask[r].tolist()
        carried = [t for t, m in zip(row_ids, row_mask) if m]
        # The carried tokens are one or more whole sampled turns, in order, and nothing else.
        remaining = carried
        used = 0
        for s in sampled_ids:
            if s and remaining[: len(s)] == s:
                remaining = remaining[len(s):]
                used += 1
        assert remaining == [], f"{algo}: row {r} carries loss on ids that were never sampled: {remaining}"
        assert used >= 1
        if used >= 2:
            seen_multi_turn = True
            # between the turns: the tool result, never carrying loss
            on = [i for i, m in enumerate(row_mask) if m]
            ctx = [row_ids[i] for i in range(on[0], on[-1]) if not row_mask[i]]
            assert "42" in tok.decode(ctx)
        last = max(i for i, a in enumerate(out["completion_mask"][r].tolist()) if a) if out["completion_mask"][r].any() else -1
        if last >= 0 and row_ids[last] == eos:
            seen_finished = True
        elif last >= 0:
            seen_truncated = True
    assert seen_multi_turn and seen_truncated and seen_finished
    assert rollout_fn.history, "the agentic rollout function did not run"


def test_logprobs_are_the_sampling_policys(monkeypatch):
    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl.rollout import RolloutConfig, TransformersRolloutEngine

    model, tok = build_tiny_model(seed=5)
    eng = TransformersRolloutEngine(model, tok, RolloutConfig(max_new_tokens=6, temperature=1.0))
    out = eng.rollout(["Q0?", "Q1?"], tools=[calculator])
    rescored = eng.score_logprobs(out["prompt_ids"], out["completion_ids"])
    for got, want in zip(out["logprobs"], rescored):
        assert got == pytest.approx(want, abs=1e-4)
    # the stored EventLog carries them on the agent's events, over the same token span
    log = out["trajectories"][0]
    p = len(out["prompt_ids"][0])
    agent = [e for e in log.events if e.logprobs is not None]
    assert agent and all(list(e.logprobs) == out["logprobs"][0][e.token_span[0] - p : e.token_span[1] - p] for e in agent)
    assert list(log.to_dict()["events"][1]["logprobs"]) == list(agent[0].logprobs)
    # at another temperature the logprobs are those of the tempered distribution
    eng.config.temperature = 0.5
    out = eng.rollout(["Q0?"], tools=[calculator])
    plain = eng.score_logprobs(out["prompt_ids"], out["completion_ids"])[0]
    assert out["logprobs"][0] != pytest.approx(plain, abs=1e-3)


def test_grpo_passes_the_sampled_logprobs_to_the_trainer(monkeypatch):
    trainer, turns, out, tok = _train_one_step("grpo", monkeypatch)
    lps = out["sampling_per_token_logps"]
    mask = out["completion_mask"] * out["tool_mask"]
    ids = out["completion_ids"]
    by_ids = {tuple(t.ids): t.logprobs for t in turns}
    for r in range(ids.shape[0]):
        carried_ids = [int(t) for t, m in zip(ids[r], mask[r]) if m]
        carried_lps = [float(x) for x, m in zip(lps[r], mask[r]) if m]
        expected = []
        pos = 0
        while pos < len(carried_ids):
            match = next(k for k in by_ids if list(k) == carried_ids[pos : pos + len(k)])
            expected += by_ids[match]
            pos += len(match)
        assert carried_lps == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("algo", ["grpo", "rloo"])
def test_mask_truncated_completions_masks_only_truncated_turns(algo, monkeypatch):
    trainer, turns, out, tok = _train_one_step(algo, monkeypatch, mask_truncated=True)
    eos = tok.eos_token_id
    loss_mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
    ids = out["completion_ids"]
    finished_rows = truncated_rows = 0
    for r in range(ids.shape[0]):
        row = [int(t) for t in ids[r]]
        pad = tok.pad_token_id
        real = [t for t in row if t != pad]
        if real and real[-1] == eos:
            finished_rows += 1
            assert loss_mask[r].sum() > 0, "a finished episode lost its loss"
        else:
            truncated_rows += 1
            assert loss_mask[r].sum() == 0, "a truncated episode still carries loss"
    assert finished_rows >= 1 and truncated_rows >= 1


def test_rollout_marks_finished_and_truncated_turns(tiny_model):
    from agenttune_lib.rl.rollout import RolloutConfig, TransformersRolloutEngine

    model, tok = tiny_model
    eng = TransformersRolloutEngine(model, tok, RolloutConfig(max_new_tokens=3))
    out = eng.rollout(["a"], tools=[calculator])
    ids = out["completion_ids"][0]
    assert out["truncated"][0] == (ids[-1] != tok.eos_token_id)
    assert out["trajectories"][0].metadata["truncated"] == out["truncated"][0]
    assert sum(out["env_mask"][0]) == len(ids) <= 3


def test_rloo_rewards_see_the_episode_as_messages(monkeypatch):
    seen = []

    def spy(completions, **kwargs):
        seen.extend(completions)
        return [float(len(c)) for c in completions]

    _train_one_step("rloo", monkeypatch, reward_funcs=[spy])
    episode = next(c for c in seen if any(m["role"] == "tool" for m in c))
    assert [m["role"] for m in episode][:2] == ["assistant", "tool"] and "42" in episode[1]["content"]
    assert CALL in episode[0]["content"]


def test_tools_are_shown_in_the_templates_own_format_when_it_has_one():
    from agenttune_lib.models.tiny import build_tiny_tokenizer
    from agenttune_lib.rl.turns import render_prompt_ids, template_supports_tools
    from agenttune_lib.tools.base import as_tool

    schemas = [as_tool(calculator).to_schema()]
    plain = build_tiny_tokenizer()
    assert not template_supports_tools(plain)
    ids, msgs, ttools = render_prompt_ids(plain, [{"role": "user", "content": "2+2?"}], schemas)
    assert ttools is None and msgs[0]["role"] == "system" and "calculator" in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]
    hermes = build_tiny_tokenizer()
    hermes.chat_template = (
        "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert template_supports_tools(hermes)
    ids, msgs, ttools = render_prompt_ids(hermes, [{"role": "user", "content": "2+2?"}], schemas)
    assert ttools == schemas and msgs == [{"role": "user", "content": "2+2?"}]
    assert hermes.decode(ids).startswith("<|im_start|>system\nTOOLS: calculator<|im_end|>")
