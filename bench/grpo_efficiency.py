"""Vanilla GRPO vs efficient GRPO (pre-rollout filtering + max-variance down-sampling) on a tool-calling environment.

Task: the BFCL-style single-call environment (agenttune_lib.rl.environments.ToolCallEnvironment) built from the
platform's τ² retail data: a customer brief plus a goal, answered with exactly one call; reward 1.0 for the exact
call, 0.5 + 0.4 × (share of arguments right) for the right function, 0 otherwise. Held-out probes are the test
split's tasks (disjoint τ² tasks). Model: the bundled SmolLM2-135M-Instruct, warm-started from an SFT adapter
when ``--sft-adapter`` is given (merged into the base before the RL LoRA); ``--sft-train`` trains that adapter first
(``sft_warm_start``: token-weighted SFT on gold single calls of the train tasks outside the GRPO pool).

Protocol (tool-calling-rl-efficiency §4.3): each arm's learning rate is picked on a small grid (seed 0, best
final held-out reward), then 3 seeds per arm at that lr with the same data pool and step budget. The arms
alternate which runs first per seed. One untimed warm-up generation + step runs before any timed run. Per step
we time rollout (generation + scoring) and update separately, count prompts skipped by the filter, and evaluate
the held-out probes (greedy) every ``--eval-every`` steps off the clock. Reported: steps to reach
``--threshold`` held-out reward, per-step wall-clock, prompts skipped, and training time to the threshold,
each with its spread over seeds. A speed-up is claimed only when every run of every arm reached the threshold
robustly (``claim_decision``: one probe's worth to spare, and a start more than one probe below it); plus Table 8's GRPO row (contract and correct-label rate on
the held-out probes before and after, vanilla arm).

    .venv/bin/python bench/grpo_efficiency.py --sft-train --eval-only --pool 8 --probes 16 --sft-steps 24 --sft-lr 5e-3 --sft-out SFT
    .venv/bin/python bench/grpo_efficiency.py --sft-adapter SFT --pool 4 --probes 12 --steps 6 --eval-every 3 \
        --prompts-per-step 2 --lrs 2e-4,1e-3 --out bench/grpo_efficiency.json     # the run in bench/RESULTS.md
    .venv/bin/python bench/grpo_efficiency.py --tiny --steps 2   # smoke run on a random tiny model
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_policy(args):
    """(model, tokenizer): SmolLM2 (optionally with an SFT adapter merged in) or a random tiny model for --tiny."""
    import torch

    if args.tiny:
        from agenttune_lib.models.tiny import build_tiny_model

        return build_tiny_model(seed=0)
    from agenttune_lib.models.base import ensure_base_model, load_base_model

    path = args.base_model or ensure_base_model(Path(os.environ.get("AGENTTUNE_HOME", "/tmp/agenttune-home")) / "models").path
    model, tok = load_base_model(path)
    if args.sft_adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.sft_adapter).merge_and_unload()
    torch.set_num_threads(max(1, args.threads))
    return model, tok


def sft_rows(tok, tasks) -> list[dict]:
    """Weighted-SFT token rows: the prompt exactly as the rollout engine renders it for the task's environment, then
    the gold call and the end of turn (weight 2.0, Table 3's tool-call weight; the prompt carries none)."""
    from agenttune_lib.rl.environments import ToolCallEnvironment
    from agenttune_lib.rl.turns import render_prompt_ids
    from agenttune_lib.teachers.base import tool_call_text
    from agenttune_lib.tools.base import as_tools

    end = tok("<|im_end|>", add_special_tokens=False)["input_ids"]
    rows = []
    for task in tasks:
        env = ToolCallEnvironment()
        messages = env.reset(task)
        schemas = [t.to_schema() for t in as_tools(env.tools()).values()]
        prompt_ids, _, _ = render_prompt_ids(tok, messages, schemas, env.tool_format)
        call = tok(tool_call_text(task["expected"]["name"], task["expected"]["arguments"]), add_special_tokens=False)["input_ids"] + end
        rows.append({"input_ids": prompt_ids + call, "labels": [-100] * len(prompt_ids) + call,
                     "token_weights": [0.0] * len(prompt_ids) + [2.0] * len(call), "task_id": task["task_id"]})
    return rows


def sft_warm_start(args) -> str:
    """The SFT warm start: the platform's token-weighted SFT (``WeightedSFTTrainer``, Table 3's tool-call weight) on gold
    single-call demonstrations of the train split's tasks outside the GRPO pool, each prompt rendered exactly as the
    rollout engine renders it (``render_prompt_ids``: the environment's messages and tool listing)."""
    from datasets import Dataset
    from trl import SFTConfig

    from agenttune_lib.models.precision import resolve_dtype
    from agenttune_lib.rl.environments import tool_call_tasks
    from agenttune_lib.rl.lora import lora_config
    from agenttune_lib.rl.weighted_sft import WeightedSFTTrainer

    model, tok = load_policy(argparse.Namespace(**{**vars(args), "sft_adapter": None}))
    rows = sft_rows(tok, tool_call_tasks("train")[args.pool:])  # disjoint from the GRPO pool: the warm start has not seen those prompts
    n_layers = int(model.config.num_hidden_layers)
    lora = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            "layers_to_transform": list(range(max(n_layers - args.sft_top_layers, 0), n_layers))}
    out = Path(args.sft_out)
    trainer = WeightedSFTTrainer(
        model=model, processing_class=tok, peft_config=lora_config(lora), train_dataset=Dataset.from_list([{k: r[k] for k in ("input_ids", "labels", "token_weights")} for r in rows]),
        args=SFTConfig(output_dir=str(out) + ".work", use_cpu=True, bf16=resolve_dtype(args.precision, "--precision") == "bfloat16",
                       report_to="none", save_strategy="no", logging_steps=1, max_steps=args.sft_steps, learning_rate=args.sft_lr,
                       per_device_train_batch_size=4, seed=0, dataset_kwargs={"skip_prepare_dataset": True}, remove_unused_columns=False),
    )
    trainer.train()
    trainer.model.save_pretrained(str(out))
    print(f"SFT warm start: {len(rows)} gold single-call demonstrations (train split, outside the pool of {args.pool}), "
          f"{args.sft_steps} steps at lr {args.sft_lr} -> {out}", flush=True)
    return str(out)


def compute_context(args):
    """bf16 autocast over fp32 weights (rollouts, updates and probes alike, both arms) where the CPU has native bf16."""
    import contextlib

    import torch

    from agenttune_lib.models.precision import resolve_dtype

    if args.tiny or resolve_dtype(args.precision, "--precision") != "bfloat16":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16)


def probe_eval(model, tok, probes, max_new_tokens: int) -> dict:
    """Greedy single-call replies on held-out probes: mean reward, contract rate, correct-label rate."""
    from agenttune_lib.rl.environments import ToolCallEnvironment
    from agenttune_lib.rl.environments.tool_call import CANDIDATE_TOOLS
    from agenttune_lib.rl.rewards._text import tool_calls
    from agenttune_lib.rl.rollout import RolloutConfig, TransformersRolloutEngine

    eng = TransformersRolloutEngine(model, tok, RolloutConfig(max_new_tokens=max_new_tokens, do_sample=False, max_length=None), batch_size=8)
    out = eng.rollout(["x"] * len(probes), environments=[ToolCallEnvironment() for _ in probes], tasks=probes)
    contract = 0
    for comp in out["completions"]:
        calls, errors = tool_calls([comp[0]])
        contract += int(len(calls) == 1 and not errors and calls[0].name in CANDIDATE_TOOLS)
    n = len(probes)
    return {"reward": sum(out["env_reward"]) / n, "probe_rewards": [float(r) for r in out["env_reward"]], "contract_rate": contract / n, "correct_label_rate": sum(map(bool, out["env_success"])) / n,
            "truncated_rate": sum(map(bool, out["truncated"])) / n, "first_reply": out["responses"][0][:300]}


def run_arm(arm: str, lr: float, seed: int, args, probes, pool) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from agenttune_lib.rl import EfficiencyConfig, create_agentic_trainer
    from agenttune_lib.rl.environments import ToolCallEnvironment, environment_factories, environment_rows

    torch.manual_seed(seed)
    model, tok = load_policy(args)
    rows = environment_rows(ToolCallEnvironment(), pool)
    eff = EfficiencyConfig(pre_rollout_filter=True, k=1, skip_window=1, correct_threshold=1.0, keep_rollouts=args.m) if arm == "efficient" else None
    n_layers = int(model.config.num_hidden_layers)
    lora = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            "layers_to_transform": list(range(max(n_layers - args.lora_top_layers, 0), n_layers))}
    trainer = create_agentic_trainer(
        "grpo", model=model, tokenizer=tok, train_dataset=Dataset.from_list(rows), reward_funcs=["environment_reward"],
        environments=environment_factories(["tool_call"]), efficiency=eff, lora=lora, max_steps=args.steps, learning_rate=lr,
        num_generations=args.n, per_device_train_batch_size=args.n * args.prompts_per_step, steps_per_generation=1,
        max_completion_length=args.max_new_tokens, temperature=1.0, seed=seed, beta=0.0, logging_steps=1,
        gradient_checkpointing=False,  # TRL turns it on by default: a second forward per update, for memory this run does not need
    )
    timing = {"rollout": [], "step": [], "eval": 0.0, "t_train": 0.0}
    curve = []  # (step, train seconds so far, held-out reward)
    orig = trainer._generate_and_score_completions

    def timed(inputs):
        t = time.perf_counter()
        out = orig(inputs)
        timing["rollout"].append(time.perf_counter() - t)
        return out

    trainer._generate_and_score_completions = timed
    with compute_context(args):
        before = probe_eval(trainer.model, tok, probes, args.max_new_tokens)
    curve.append((0, 0.0, before["reward"]))
    last = {"eval": before}

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            dt = time.perf_counter() - self.t
            timing["step"].append(dt)
            timing["t_train"] += dt
            if state.global_step % args.eval_every == 0 or state.global_step == args.steps:
                t = time.perf_counter()
                last["eval"] = probe_eval(trainer.model, tok, probes, args.max_new_tokens)
                curve.append((state.global_step, timing["t_train"], last["eval"]["reward"]))
                timing["eval"] += time.perf_counter() - t

    trainer.add_callback(Clock())
    with compute_context(args):
        trainer.train()
    after = last["eval"]  # the evaluation at the final step
    skipped = sum(s.prompts_skipped for s in trainer.efficiency_log)
    update = [s - r for s, r in zip(timing["step"], timing["rollout"])]
    return {
        "arm": arm, "lr": lr, "seed": seed, "curve": curve, "before": before, "after": after, "n_probes": len(probes),
        "rollout_s": timing["rollout"], "update_s": update, "step_s": timing["step"], "eval_s": timing["eval"],
        "prompts_skipped": skipped, "prompts_seen": sum(s.prompts for s in trainer.efficiency_log),
        "rollouts_generated": sum(s.rollouts_generated for s in trainer.efficiency_log),
        "rollouts_used": sum(s.rollouts_used for s in trainer.efficiency_log),
        "train_reward": [s.mean_reward for s in trainer.efficiency_log],
    }


def _mean_sd(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"mean": round(statistics.fmean(xs), 3), "sd": round(statistics.pstdev(xs), 3) if len(xs) > 1 else 0.0, "n": len(xs)}


def steps_to(curve, level):
    return next((s for s, _, r in curve if s > 0 and r >= level - 1e-9), None)


def probe_margin(run) -> float:
    """The most one held-out probe can move the run's mean reward (rewards lie in [0, 1]): 1 / number of probes."""
    n = run.get("n_probes")
    if not n:
        raise ValueError(f"run {run.get('arm')}/seed {run.get('seed')} records no n_probes: a claim's robustness to one probe cannot be judged")
    return 1.0 / n


def robust_reach(run, target):
    """(step, train seconds) of the first evaluation whose reward stays >= target with any one probe changed, or None."""
    m = probe_margin(run)
    return next(((s, t) for s, t, r in run["curve"] if s > 0 and r - m >= target - 1e-9), None)


def claim_decision(runs, target):
    """Claim a time-to-target speed-up only if every run of every arm reached ``target`` on held-out reward robustly.

    Robustly means the verdict survives any one probe changing in any evaluation: each run starts more than one
    probe's worth below the target and reaches it with one probe's worth to spare. Otherwise no ratio is given.
    """
    arms = {a: [r for r in runs if r["arm"] == a] for a in ("vanilla", "efficient")}
    for arm, rs in arms.items():
        if not rs:
            return {"claim": False, "speedup": None, "note": f"no {arm} runs: no comparison"}
    high_start = [f"{r['arm']}/seed {r['seed']} ({r['before']['reward']:.3f})" for r in runs
                  if r["before"]["reward"] + probe_margin(r) >= target - 1e-9]
    if high_start:
        return {"claim": False, "speedup": None,
                "note": f"target {target} is within one probe of the untrained held-out reward of {', '.join(high_start)}: "
                        "reaching it would not show learning"}
    reached = {arm: [robust_reach(r, target) for r in rs] for arm, rs in arms.items()}
    counts = {arm: f"{sum(x is not None for x in xs)}/{len(xs)}" for arm, xs in reached.items()}
    if not all(x is not None for xs in reached.values() for x in xs):
        return {"claim": False, "speedup": None, "reached": counts,
                "note": f"held-out reward {target} reached robustly (one probe to spare) by vanilla in {counts['vanilla']} and "
                        f"efficient in {counts['efficient']} seeds: every run of every arm must reach it for a speed-up claim"}
    times = {arm: statistics.fmean(t for _, t in xs) for arm, xs in reached.items()}
    return {"claim": True, "speedup": round(times["vanilla"] / times["efficient"], 2), "reached": counts,
            "time_to_target_s": {a: round(t, 1) for a, t in times.items()},
            "note": f"mean training seconds to held-out reward {target} (every run, one probe to spare), vanilla / efficient"}


def summarise(runs, threshold):
    arms = {}
    vanilla_best = statistics.fmean(max(r for s, _, r in run["curve"] if s > 0) for run in runs if run["arm"] == "vanilla")
    for arm in ("vanilla", "efficient"):
        rs = [r for r in runs if r["arm"] == arm]
        excl = lambda key: [statistics.fmean(r[key][1:]) for r in rs if len(r[key]) > 1]  # noqa: E731 - warm-up step excluded
        reach = [robust_reach(r, threshold) for r in rs]
        arms[arm] = {
            "lr": rs[0]["lr"], "seeds": [r["seed"] for r in rs],
            "final_heldout_reward": _mean_sd([r["after"]["reward"] for r in rs]),
            "steps_to_threshold": {"values": [steps_to(r["curve"], threshold) for r in rs]},
            "robust_time_to_threshold_s": {"values": [None if x is None else round(x[1], 1) for x in reach]},
            "rollout_s_per_step": _mean_sd(excl("rollout_s")), "update_s_per_step": _mean_sd(excl("update_s")), "step_s": _mean_sd(excl("step_s")),
            "prompts_skipped": [r["prompts_skipped"] for r in rs], "prompts_seen": [r["prompts_seen"] for r in rs],
            "rollouts_generated": [r["rollouts_generated"] for r in rs], "rollouts_used": [r["rollouts_used"] for r in rs],
        }
        for key in ("steps_to_threshold", "robust_time_to_threshold_s"):
            vals = arms[arm][key]["values"]
            arms[arm][key]["reached"] = f"{sum(v is not None for v in vals)}/{len(vals)}"
            arms[arm][key].update(_mean_sd(vals) or {})
    start = statistics.fmean(r["before"]["reward"] for r in runs)
    decision = claim_decision(runs, threshold)
    vr = [r for r in runs if r["arm"] == "vanilla"]
    table8 = {k: {"before": _mean_sd([r["before"][k] for r in vr]), "after": _mean_sd([r["after"][k] for r in vr])}
              for k in ("contract_rate", "correct_label_rate", "reward")}
    return {"arms": arms, "initial_heldout_reward": round(start, 3), "vanilla_best_heldout_reward": round(vanilla_best, 3),
            "claim": decision["claim"], "speedup_time_to_threshold": decision["speedup"], "speedup_note": decision["note"],
            "table8_grpo": table8}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--n", type=int, default=4, help="rollouts per prompt")
    p.add_argument("--m", type=int, default=2, help="rollouts kept per prompt by max-variance down-sampling")
    p.add_argument("--prompts-per-step", type=int, default=1)
    p.add_argument("--pool", type=int, default=2, help="training tasks cycled through (small, so prompts recur and the filter can act)")
    p.add_argument("--probes", type=int, default=4, help="held-out probes (test split)")
    p.add_argument("--lrs", default="5e-4,2e-3", help="learning-rate grid, tuned per arm on seed 0")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--threshold", type=float, default=0.5, help="held-out reward for steps-to-threshold")
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64, help="a full single call is ~60 SmolLM2 tokens")
    p.add_argument("--lora-top-layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="auto", help="float32, bfloat16 (autocast) or auto (bfloat16 where the CPU has it natively)")
    p.add_argument("--probe-split", default="test", help="held-out probes' split (train scores the warm start on the training pool)")
    p.add_argument("--base-model", default=None)
    p.add_argument("--sft-adapter", default=None, help="SFT adapter dir to warm-start from (merged into the base)")
    p.add_argument("--sft-train", action="store_true", help="first train the SFT warm start (sft_warm_start) and start from it")
    p.add_argument("--sft-steps", type=int, default=16)
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument("--sft-top-layers", type=int, default=8, help="layers the SFT LoRA adapts (all linear modules)")
    p.add_argument("--sft-out", default="/tmp/agenttune-grpo-bench-sft")
    p.add_argument("--tiny", action="store_true", help="random tiny model (smoke run only)")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="an untimed warm-up run first (each run's first step is excluded from per-step timings either way)")
    p.add_argument("--out", default=None)
    p.add_argument("--eval-only", action="store_true", help="only score the (adapter-merged) base model on the held-out probes")
    args = p.parse_args(argv)

    from agenttune_lib.rl.environments import tool_call_tasks

    if args.sft_train:
        args.sft_adapter = sft_warm_start(args)
    pool = tool_call_tasks("train")[: args.pool]
    probes = tool_call_tasks(args.probe_split)[: args.probes]
    if args.eval_only:  # Table 8's "before" column (or an adapter's "after") on the held-out probes, no training
        t = time.perf_counter()
        model, tok = load_policy(args)
        with compute_context(args):
            res = probe_eval(model, tok, probes, args.max_new_tokens)
        res.update(probes=len(probes), seconds=round(time.perf_counter() - t, 1), sft_adapter=args.sft_adapter)
        print(json.dumps(res, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=2))
        return 0
    lrs = [float(x) for x in args.lrs.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    log = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True)  # noqa: E731
    log(f"pool={len(pool)} train tasks, probes={len(probes)} held-out, steps={args.steps}, n={args.n}, m={args.m}, sft_adapter={args.sft_adapter or 'none (cold start)'}")
    if args.warmup:
        # Warm-up (untimed): one generation and step so lazy init and thread pools are not charged to the first arm.
        run_arm("vanilla", lrs[0], 99, argparse.Namespace(**{**vars(args), "steps": 1, "eval_every": 10**6}), probes[:1], pool[: args.prompts_per_step])
        log("warm-up done")
    grid: list[dict] = []
    runs_done: list[dict] = []

    def checkpoint(r):
        runs_done.append(r)
        if args.out:  # partial results survive an interrupted run
            Path(args.out + ".partial").write_text(json.dumps(runs_done, default=str))

    for i, lr in enumerate(lrs):
        order = ("vanilla", "efficient") if i % 2 == 0 else ("efficient", "vanilla")
        for arm in order:
            r = run_arm(arm, lr, seeds[0], args, probes, pool)
            log(f"grid {arm} lr={lr}: held-out {r['before']['reward']:.3f} -> {r['after']['reward']:.3f}, "
                f"rollout {r['rollout_s']}, update {r['update_s']}, skipped {r['prompts_skipped']}, train reward {r['train_reward']}")
            grid.append(r)
            checkpoint(r)
    best = {arm: max((r for r in grid if r["arm"] == arm), key=lambda r: (r["after"]["reward"], -r["lr"]))["lr"] for arm in ("vanilla", "efficient")}
    log(f"chosen lr: {best}")
    runs = [r for r in grid if r["lr"] == best[r["arm"]]]
    for j, seed in enumerate(seeds[1:], 1):
        order = ("efficient", "vanilla") if j % 2 else ("vanilla", "efficient")
        for arm in order:
            r = run_arm(arm, best[arm], seed, args, probes, pool)
            log(f"seed {seed} {arm}: held-out {r['before']['reward']:.3f} -> {r['after']['reward']:.3f}, "
                f"rollout {r['rollout_s']}, update {r['update_s']}, skipped {r['prompts_skipped']}, train reward {r['train_reward']}")
            runs.append(r)
            checkpoint(r)
    summary = summarise(runs, args.threshold)
    result = {"config": {k: v for k, v in vars(args).items()}, "grid": [{k: r[k] for k in ("arm", "lr", "seed", "before", "after")} for r in grid],
              "runs": runs, "summary": summary}
    text = json.dumps(result, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
