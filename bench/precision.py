"""float32 vs bfloat16 on this machine, side by side in one run, for the two things the main job spends its time on.

1. Batched greedy generation as evaluation runs it (``load_policy`` + ``BatchedChatPolicy.generate_batch``).
2. One LoRA training step (top 4 layers, r = 8) on batch x length tokens, as ``trained_adapter`` trains (bf16 is
   autocast over fp32 weights, the ``precision="bfloat16"`` path).

The two dtypes alternate ``--repeat`` times and each figure is the best of its runs. Prints whether the CPU has native
bf16 (``agenttune_lib.models.precision.native_bf16``): without it bf16 is emulated and slower.
Usage: .venv/bin/python bench/precision.py [--threads 2] [--rows 16] [--new-tokens 64] [--batch 4] [--length 768]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=768)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default=None, help="models dir holding the converted base model (default: a temporary one)")
    args = ap.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model

    from agenttune_lib.evaluation.batched import BatchedChatPolicy
    from agenttune_lib.models.base import ensure_base_model, load_base_model
    from agenttune_lib.models.precision import native_bf16

    torch.set_num_threads(args.threads)
    info = ensure_base_model(args.models or tempfile.mkdtemp(prefix="agenttune-precision-"))
    convs = [[{"role": "system", "content": "You are a contract search agent. " * 20},
              {"role": "user", "content": f"Question {i}: which clause covers sublicensing rights to third parties in contract {i}?"}]
             for i in range(args.rows)]

    gen: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    texts: dict[str, list[str]] = {}
    base, tok = load_base_model(info.path)
    for _ in range(args.repeat):
        for dt in ("float32", "bfloat16"):
            policy = BatchedChatPolicy(base.to(getattr(torch, dt)), tok, max_new_tokens=args.new_tokens, batch_size=args.rows)
            t = time.perf_counter()
            out = policy.generate_batch(convs)
            gen[dt].append(time.perf_counter() - t)
            texts[dt] = [g.text for g in out]
    same_prefix = sum(a[:40] == b[:40] for a, b in zip(texts["float32"], texts["bfloat16"]))

    model, _ = load_base_model(info.path)
    n = model.config.num_hidden_layers
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                      layers_to_transform=list(range(n - 4, n)), task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lora)
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-4)
    x = torch.randint(0, model.config.vocab_size, (args.batch, args.length))
    step: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for _ in range(args.repeat):
        for dt in ("float32", "bfloat16"):
            t = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dt == "bfloat16"):
                loss = peft_model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            step[dt].append(time.perf_counter() - t)

    g32, g16, s32, s16 = min(gen["float32"]), min(gen["bfloat16"]), min(step["float32"]), min(step["bfloat16"])
    print(json.dumps({"native_bf16": native_bf16(), "threads": args.threads, "repeat": args.repeat}))
    print(f"generation, {args.rows} rows x {args.new_tokens} new tokens: float32 {g32:.2f}s  bfloat16 {g16:.2f}s  "
          f"ratio {g32 / g16:.2f}x  (first 40 characters equal in {same_prefix}/{args.rows} replies)")
    print(f"LoRA step, {args.batch} x {args.length} tokens: float32 {s32:.2f}s  bfloat16 autocast {s16:.2f}s  ratio {s32 / s16:.2f}x")


if __name__ == "__main__":
    main()
