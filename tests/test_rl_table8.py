"""Paper Table 8's shape on CPU with the real small model (SmolLM2-135M-Instruct): SFT, GRPO and DPO each move the policy."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

# Three trainings on the real SmolLM2: 72 s on a quiet 2-core machine last turn; over 15 min when the machine is shared.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

SYSTEM = "Reply only with a search tool call."
#: GRPO's prompt shows the contract once, so the base policy sometimes follows it (the paper starts at 25%).
GRPO_SYSTEM = 'Reply only with a search tool call, exactly like <tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>'

#: LoRA on the top layers only: backward stops there, which keeps a CPU step to a few seconds.
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"], "layers_to_transform": [26, 27, 28, 29]}
CONTRACT = '<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>'
TOPICS = ["termination notice", "governing law", "indemnification cap", "renewal term", "audit rights", "non-compete scope",
          "payment terms", "liability limit"]


def _model_dir() -> Path:
    """A converted SmolLM2 checkpoint cached across test runs (conversion takes about 40 s once)."""
    from agenttune_lib.models.base import ensure_base_model

    cache = Path(os.environ.get("AGENTTUNE_TEST_MODELS", Path(tempfile.gettempdir()) / "agenttune-test-models"))
    return ensure_base_model(cache).path


def contract_reward(completions, **kwargs):
    """Contract-only reward, shaped: 1.0 a well-formed tool call, else up to 0.5 for the longest prefix of
    ``<tool_call>`` the reply contains, plus 0.1 for naming the search tool."""
    from agenttune_lib.rl.rewards._text import full_text, tool_calls

    tag = "<tool_call>"
    out = []
    for c in completions:
        if tool_calls(c)[0]:
            out.append(1.0)
            continue
        text = full_text(c)
        prefix = max((k for k in range(len(tag) + 1) if tag[:k] in text), default=0)
        out.append(0.5 * prefix / len(tag) + (0.1 if "search" in text.lower() else 0.0))
    return out


def _contract_rate(model, tok, prompts, n=4):
    import torch

    hits = 0
    for p in prompts[:n]:
        text = tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
        hits += "<tool_call>" in tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    return hits / n


def test_table8_shape_sft_grpo_dpo():
    from datasets import Dataset

    from agenttune_lib.models.base import load_base_model
    from agenttune_lib.rl import create_agentic_trainer
    from agenttune_lib.rl.distill import distill
    from agenttune_lib.rl.rollout import episode_to_eventlog

    t0 = time.perf_counter()
    path = _model_dir()
    model, tok = load_base_model(path)
    questions = [f"Find the {t} clause." for t in TOPICS]
    before = _contract_rate(model, tok, questions)
    print(f"[table8] base model ready and probed at {time.perf_counter() - t0:.0f}s", flush=True)

    # Distillation (SFT): 8 teacher trajectories, LoRA, completion-only loss over the tool call.
    logs = []
    for q, t in zip(questions, TOPICS):
        log, _ = episode_to_eventlog(tok, SYSTEM, q, [{"kind": "tool_call", "payload": {"name": "search", "arguments": {"query": t}}}])
        logs.append(log)
    sft = distill(model, tok, logs, lora=LORA, max_length=64, max_steps=8, per_device_train_batch_size=4, learning_rate=1e-2, lr_scheduler_type="constant", disable_tqdm=True)
    sft.train()
    print(f"[table8] sft done at {time.perf_counter() - t0:.0f}s", flush=True)
    losses = [h["loss"] for h in sft.state.log_history if "loss" in h]
    assert losses[-1] < 0.5 * losses[0], losses
    student = sft.model
    after = _contract_rate(student, tok, questions)
    assert after > before and after >= 0.5, (before, after)
    t_sft = time.perf_counter() - t0

    # GRPO on the contract reward from the base policy: mean reward rises.
    model, tok = load_base_model(path)
    prompts = Dataset.from_list([{"prompt": [{"role": "system", "content": GRPO_SYSTEM}, {"role": "user", "content": q}]} for q in questions])
    grpo = create_agentic_trainer(
        "grpo", model=model, tokenizer=tok, train_dataset=prompts, reward_funcs=[contract_reward], lora=LORA,
        num_generations=4, per_device_train_batch_size=8, max_completion_length=8, max_steps=8, learning_rate=2e-2, beta=0.0, temperature=1.0,
        lr_scheduler_type="constant", disable_tqdm=True,
    )
    grpo.train()
    print(f"[table8] grpo done at {time.perf_counter() - t0:.0f}s", flush=True)
    rewards = [h["reward"] for h in grpo.state.log_history if "reward" in h]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3, rewards
    t_grpo = time.perf_counter() - t0 - t_sft

    # DPO on corrective preference pairs: reward accuracy rises and the margin is positive.
    model, tok = load_base_model(path)
    pairs = Dataset.from_list([
        {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
         "chosen": [{"role": "assistant", "content": CONTRACT % t}],
         "rejected": [{"role": "assistant", "content": f"The {t} clause is in section 4."}]}
        for q, t in zip(questions, TOPICS)
    ])
    dpo = create_agentic_trainer("dpo", model=model, tokenizer=tok, train_dataset=pairs, lora=LORA,
                                 max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2, max_length=64,
                                 lr_scheduler_type="constant", disable_tqdm=True)
    dpo.train()
    hist = [h for h in dpo.state.log_history if "rewards/accuracies" in h]
    assert hist[-1]["rewards/accuracies"] >= hist[0]["rewards/accuracies"] and hist[-1]["rewards/accuracies"] == 1.0, hist
    assert hist[-1]["rewards/margins"] > 0
    print(f"Table 8 shape: SFT loss {losses[0]:.2f}->{losses[-1]:.2f}, contract {before:.2f}->{after:.2f} ({t_sft:.0f}s); "
          f"GRPO reward {rewards[0]:.2f}->{rewards[-1]:.2f} ({t_grpo:.0f}s); DPO acc {hist[0]['rewards/accuracies']:.2f}->"
          f"{hist[-1]['rewards/accuracies']:.2f} margin {hist[-1]['rewards/margins']:.2f}")
