"""Vanilla GRPO vs efficient GRPO (pre-rollout filtering + max-variance down-sampling), side by side.

Same task, model, seed and step budget in one process. The policy is evaluated every few
steps on every prompt (evaluation time is excluded from the training clock); the figure is
the wall-clock the efficient run needs to reach the vanilla run's final mean reward, and the
ratio vanilla-time / efficient-time.

Task: each prompt asks for tokens from one half of the vocabulary ("low" or "high"); the
reward is the share of generated tokens in that half, and a rollout is correct at >= 0.9.

    .venv/bin/python bench/grpo_efficiency.py [--steps 60] [--n 8] [--m 4]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def build_task(tokenizer, n_prompts: int):
    half = len(tokenizer) // 2
    prompts = []
    for i in range(n_prompts):
        side = "low" if i % 2 == 0 else "high"
        prompts.append({"prompt": [{"role": "user", "content": f"Task {i}: answer with {side} tokens only."}], "side": side})

    def half_reward(completions, completion_ids=None, side=None, **kwargs):
        out = []
        for ids, s in zip(completion_ids, side):
            ids = [t for t in ids if t not in (tokenizer.eos_token_id, tokenizer.pad_token_id)]
            if not ids:
                out.append(0.0)
                continue
            hits = sum(1 for t in ids if (t < half) == (s == "low"))
            out.append(hits / len(ids))
        return out

    return prompts, half_reward


def evaluate(model, tokenizer, prompts, reward, samples: int = 4, max_new_tokens: int = 8) -> float:
    import torch

    was = model.training
    model.eval()
    scores = []
    with torch.no_grad():
        for row in prompts:
            text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
            ids = tokenizer([text] * samples, return_tensors="pt", add_special_tokens=False)
            out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=True, top_k=0, temperature=1.0, pad_token_id=tokenizer.pad_token_id)
            comp = out[:, ids["input_ids"].shape[1]:].tolist()
            scores += reward(None, completion_ids=comp, side=[row["side"]] * samples)
    if was:
        model.train()
    return sum(scores) / len(scores)


def run(label: str, efficient: bool, args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl import EfficiencyConfig, create_agentic_trainer

    torch.manual_seed(args.seed)
    model, tok = build_tiny_model(hidden_size=args.hidden, num_layers=args.layers, seed=args.seed)
    prompts, reward = build_task(tok, args.prompts)
    clock = {"eval": 0.0, "t0": 0.0, "cpu_eval": 0.0, "cpu0": 0.0}
    curve: list[tuple[int, float, float]] = []
    cpu_curve: list[float] = []  # process CPU seconds at each evaluation (robust to other jobs on a shared machine)

    class EvalCallback(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            clock["t0"] = time.perf_counter()
            clock["cpu0"] = time.process_time()

        def on_step_end(self, a, state, control, model=None, **kw):
            if state.global_step % args.eval_every == 0 or state.global_step == args.steps:
                start, cpu_start = time.perf_counter(), time.process_time()
                score = evaluate(model, tok, prompts, reward)
                clock["eval"] += time.perf_counter() - start
                clock["cpu_eval"] += time.process_time() - cpu_start
                cpu_curve.append(time.process_time() - clock["cpu0"] - clock["cpu_eval"])
                curve.append((state.global_step, time.perf_counter() - clock["t0"] - clock["eval"], score))
                print(f"  [{label}] step {state.global_step}: train {curve[-1][1]:.1f}s, eval reward {score:.3f}", flush=True)

    extra = {}
    if efficient:
        extra["efficiency"] = EfficiencyConfig(pre_rollout_filter=True, k=1, skip_window=args.skip_window, correct_threshold=0.9, keep_rollouts=args.m)
    trainer = create_agentic_trainer(
        "grpo", model=model, tokenizer=tok, train_dataset=Dataset.from_list(prompts), reward_funcs=[reward], lora=False,
        num_generations=args.n, per_device_train_batch_size=args.n * args.prompts_per_step, max_completion_length=8,
        max_steps=args.steps, learning_rate=args.lr, beta=0.0, seed=args.seed, callbacks=[EvalCallback()], logging_steps=args.steps,
        disable_tqdm=True, **extra,
    )
    base = evaluate(model, tok, prompts, reward)
    trainer.train()
    log = trainer.efficiency_log
    return {
        "label": label,
        "initial_reward": base,
        "curve": curve,
        "cpu_curve": cpu_curve,
        "train_seconds": curve[-1][1],
        "train_cpu_seconds": cpu_curve[-1],
        "rollouts_generated": sum(s.rollouts_generated for s in log),
        "rollouts_used": sum(s.rollouts_used for s in log),
        "prompts_skipped": sum(s.prompts_skipped for s in log),
        "prompts_seen": sum(s.prompts for s in log),
        "frac_zero_variance": sum(s.zero_variance_groups for s in log) / max(sum(s.groups for s in log), 1),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--n", type=int, default=8, help="rollouts generated per prompt")
    p.add_argument("--m", type=int, default=4, help="rollouts kept per prompt by max-variance down-sampling")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--skip-window", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    vanilla = run("vanilla GRPO", False, args)
    efficient = run("efficient GRPO", True, args)
    target = vanilla["curve"][-1][2]
    hit = next((i for i, (_, _, r) in enumerate(efficient["curve"]) if r >= target), None)
    reach = efficient["curve"][hit][1] if hit is not None else None
    reach_cpu = efficient["cpu_curve"][hit] if hit is not None else None
    reach_step = efficient["curve"][hit][0] if hit is not None else None
    ratio = vanilla["train_seconds"] / reach if reach else None
    cpu_ratio = vanilla["train_cpu_seconds"] / reach_cpu if reach_cpu else None
    for r in (vanilla, efficient):
        print(f"{r['label']:16s} reward {r['initial_reward']:.3f} -> {r['curve'][-1][2]:.3f} in {r['train_seconds']:.1f}s; "
              f"rollouts generated {r['rollouts_generated']}, used {r['rollouts_used']}; prompts skipped "
              f"{r['prompts_skipped']}/{r['prompts_seen']}; zero-variance groups {r['frac_zero_variance']:.2f}")
        print("   curve (step, train s, eval reward): " + ", ".join(f"({s},{t:.1f},{v:.3f})" for s, t, v in r["curve"]))
    if reach is None:
        print(f"efficient GRPO did not reach vanilla's final reward {target:.3f} within the budget")
    else:
        print(f"time to vanilla's final reward {target:.3f}: vanilla {vanilla['train_seconds']:.1f}s, efficient {reach:.1f}s -> speedup {ratio:.2f}x (wall-clock)")
        print(f"  CPU time: vanilla {vanilla['train_cpu_seconds']:.1f}s, efficient {reach_cpu:.1f}s -> {cpu_ratio:.2f}x; "
              f"steps: vanilla {vanilla['curve'][-1][0]}, efficient {reach_step} -> {vanilla['curve'][-1][0] / reach_step:.2f}x")
    if args.json:
        print(json.dumps({"vanilla": vanilla, "efficient": efficient, "target": target, "efficient_reach_s": reach, "speedup": ratio, "cpu_speedup": cpu_ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
