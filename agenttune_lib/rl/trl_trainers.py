"""The five TrlAgentic* trainers over the installed TRL (imported only when a trainer is built).

GRPO, RLOO and DPO are TRL's own trainers with the agentic tool loop attached. TRL 1.16
ships no PPOTrainer and no BCOTrainer, so PPO is TRL's GRPO machinery (clipped policy
ratio, masks, PEFT) with a learned value baseline in place of the group baseline, and
BCO is TRL's KTO data pipeline (unpaired prompt/completion/label) with the BCO loss.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from trl import DPOTrainer, GRPOTrainer, KTOTrainer, RLOOTrainer

from agenttune_lib.rl.efficient import EfficiencyConfig, EfficiencyStats, PreRolloutFilter, max_variance_indices, prompt_key

__all__ = ["TrlAgenticGRPO", "TrlAgenticPPO", "TrlAgenticRLOO", "TrlAgenticDPO", "TrlAgenticBCO"]


def _slice_batch(output: dict[str, Any], index: torch.Tensor) -> dict[str, Any]:
    """Rows ``index`` of every per-rollout tensor in a TRL generation batch."""
    n = output["completion_ids"].shape[0]
    out = {}
    for key, value in output.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n:
            out[key] = value.index_select(0, index.to(value.device))
        else:
            out[key] = value
    mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
    out["num_items_in_batch"] = mask.sum()
    return out


class TrlAgenticGRPO(GRPOTrainer):
    """TRL GRPO plus optional efficiency (pre-rollout filtering, max-variance down-sampling) and per-step logs."""

    def __init__(self, *args: Any, efficiency: EfficiencyConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if efficiency is not None and efficiency.keep_rollouts is not None and efficiency.keep_rollouts >= self.num_generations:
            raise ValueError(
                f"efficiency.keep_rollouts={efficiency.keep_rollouts} must be below num_generations={self.num_generations}: "
                "max-variance down-sampling keeps m of n rollouts per prompt (m >= n would keep them all and do nothing)"
            )
        self.efficiency = efficiency
        self.prompt_filter = (
            PreRolloutFilter(efficiency.k, efficiency.skip_window, efficiency.correct_threshold)
            if efficiency is not None and efficiency.pre_rollout_filter
            else None
        )
        self.efficiency_log: list[EfficiencyStats] = []
        self.reward_log: list[tuple[int, float, float]] = []  # (step, mean reward, wall-clock seconds)
        self._t0 = time.perf_counter()
        self._last_rewards: torch.Tensor | None = None
        self.importance_log: list[dict[str, float]] = []  # per step, when an engine outside the trainer sampled

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: D401 - TRL hook
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        self._last_rewards = (rewards_per_func * weights).nansum(dim=1).detach()
        self.attach_rollout_rewards(inputs, self._last_rewards.tolist())
        return rewards_per_func

    def attach_rollout_rewards(self, inputs, rewards) -> None:
        """Hand each agentic rollout's reward back to the rollout function, which writes the EventLog with it."""
        flush = getattr(self.rollout_func, "flush", None)
        if flush is None:
            return
        flush({row["trajectory_ids"]: float(r) for row, r in zip(inputs, rewards) if row.get("trajectory_ids")})

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        g = self.num_generations
        groups = [inputs[i : i + g] for i in range(0, len(inputs), g)]
        keys = [prompt_key(grp[0].get("prompt")) for grp in groups]
        keep = [True] * len(groups)
        if self.prompt_filter is not None:
            keep = [not self.prompt_filter.should_skip(k) for k in keys]
            if not any(keep):  # every prompt is resting: re-admit the first so the step still learns
                keep[0] = True
                self.prompt_filter.skipped[keys[0]] = 0
        kept_inputs = [row for grp, k in zip(groups, keep) if k for row in grp]
        kept_keys = [k for k, flag in zip(keys, keep) if flag]
        output = self._generate_and_score_with_policy(kept_inputs)
        rewards = self._last_rewards.detach().float().cpu()
        n_groups = len(kept_keys)
        grouped = rewards.view(n_groups, g)
        zero_var = int((grouped.std(dim=1, unbiased=False) < 1e-8).sum())
        if self.prompt_filter is not None:
            for key, row in zip(kept_keys, grouped.tolist()):
                self.prompt_filter.record(key, row)
        used = len(kept_inputs)
        m = self.efficiency.keep_rollouts if self.efficiency is not None else None
        if m is not None and m < g:
            picks, advantages = [], []
            for gi, row in enumerate(grouped.tolist()):
                idx = max_variance_indices(row, m)
                vals = torch.tensor([row[i] for i in idx])
                adv = vals - vals.mean()
                if self.scale_rewards != "none":
                    adv = adv / (vals.std(unbiased=False) + 1e-4)
                picks += [gi * g + i for i in idx]
                advantages.append(adv)
            output = _slice_batch(output, torch.tensor(picks))
            output["advantages"] = torch.cat(advantages).to(output["advantages"].device, output["advantages"].dtype)
            used = len(picks)
        if self._samples_elsewhere():
            output = self._importance_correct(output)
        stats = EfficiencyStats(
            step=int(self.state.global_step),
            prompts=len(groups),
            prompts_skipped=len(groups) - n_groups,
            groups=n_groups,
            zero_variance_groups=zero_var,
            rollouts_generated=len(kept_inputs),
            rollouts_used=used,
            mean_reward=float(rewards.mean()),
        )
        self.efficiency_log.append(stats)
        self.reward_log.append((stats.step, stats.mean_reward, time.perf_counter() - self._t0))
        metrics = self._metrics["train"]
        metrics["efficiency/frac_prompts_skipped"].append(stats.frac_skipped)
        metrics["efficiency/frac_zero_variance_groups"].append(stats.frac_zero_variance)
        metrics["efficiency/rollouts_generated"].append(float(stats.rollouts_generated))
        metrics["efficiency/rollouts_used"].append(float(stats.rollouts_used))
        return output

    def _samples_elsewhere(self) -> bool:
        """Whether rollouts come from policy copies outside the trainer (a weight-receiving engine such as Ray)."""
        engine = getattr(getattr(self, "rollout_func", None), "engine", None)
        return bool(getattr(engine, "receives_weights", False))

    def _importance_correct(self, output):
        """TRL's vLLM importance-sampling correction, applied to an engine's recorded sampling logprobs.

        TRL applies it only under ``use_vllm``; a Ray actor is the same situation (a policy copy samples,
        the trainer recomputes). The ratio is computed exactly as TRL does (``vllm_importance_sampling_mode``,
        ``_clip_min``/``_clip_max``) and folded into per-token advantages, which equals TRL's
        ``per_token_loss * importance_sampling_ratio`` for every loss linear in the advantage (all but vespo).
        """
        samp = output.get("sampling_per_token_logps")
        if samp is None:
            raise ValueError("the rollout engine returned no sampling logprobs: the importance-sampling correction needs them")
        mask = output["completion_mask"] if "tool_mask" not in output else output["completion_mask"] * output["tool_mask"]
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attn = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        old = output.get("old_per_token_logps")
        if old is None:
            with torch.no_grad():
                old, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attn, output["completion_ids"].size(1))
        diff = torch.nan_to_num((old.float() - samp.float()) * mask, nan=0.0)
        mode = self.args.vllm_importance_sampling_mode
        logd = diff.sum(dim=-1, keepdim=True) if mode in ("sequence_mask", "sequence_truncate") else diff
        ratio = torch.exp(logd)
        lo, hi = self.args.vllm_importance_sampling_clip_min, self.args.vllm_importance_sampling_clip_max
        if mode in ("sequence_truncate", "token_truncate"):
            ratio = torch.clamp(ratio, min=lo, max=hi)
        elif mode in ("sequence_mask", "token_mask"):
            lo_v = lo if lo is not None else -math.inf
            hi_v = hi if hi is not None else math.inf
            ratio = ratio.masked_fill((ratio < lo_v) | (ratio > hi_v), 0.0)
        else:
            raise ValueError(f"unknown vllm_importance_sampling_mode {mode!r}")
        adv = output["advantages"]
        adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
        output["advantages"] = adv * ratio.to(adv.device, adv.dtype)
        output["importance_sampling_ratio"] = ratio
        gap = (old.float() - samp.float()).abs()
        m = mask.bool()
        flat = ratio.expand_as(mask)[m] if ratio.shape[-1] == 1 else ratio[m]
        record = {
            "step": int(self.state.global_step),
            "logp_gap_mean": float(gap[m].mean()) if m.any() else 0.0,
            "logp_gap_max": float(gap[m].max()) if m.any() else 0.0,
            "ratio_min": float(flat.min()) if flat.numel() else 1.0,
            "ratio_mean": float(flat.mean()) if flat.numel() else 1.0,
            "ratio_max": float(flat.max()) if flat.numel() else 1.0,
            "masked_fraction": float((flat == 0).float().mean()) if flat.numel() else 0.0,
        }
        self.importance_log.append(record)
        metrics = self._metrics["train"]
        metrics["sampling/sampling_logp_difference/mean"].append(record["logp_gap_mean"])
        metrics["sampling/sampling_logp_difference/max"].append(record["logp_gap_max"])
        metrics["sampling/importance_sampling_ratio/min"].append(record["ratio_min"])
        metrics["sampling/importance_sampling_ratio/mean"].append(record["ratio_mean"])
        metrics["sampling/importance_sampling_ratio/max"].append(record["ratio_max"])
        return output

    def _generate_and_score_with_policy(self, inputs):
        """Hook for subclasses that replace the advantage (PPO)."""
        self._agentic_inputs = inputs  # the rollout function reads each row's environment and task
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self._agentic_inputs = None


class TrlAgenticPPO(TrlAgenticGRPO):
    """PPO (see agenttune_lib.rl.ppo): per-token critic, GAE(γ, λ), KL to the reference in the reward, clipped
    policy ratio over ``num_iterations`` epochs per batch (TRL's loss, per-token advantages), clipped value loss."""

    def __init__(self, *args: Any, value_model: Any = None, ppo: Any = None, **kwargs: Any) -> None:
        from agenttune_lib.rl.ppo import PPOSettings

        if value_model is None:
            raise ValueError("PPO needs value_model= (a per-token critic: agenttune_lib.rl.ppo.build_value_model(policy))")
        eff = kwargs.get("efficiency")
        if eff is not None and eff.keep_rollouts is not None:
            raise ValueError(
                "PPO cannot combine with max-variance down-sampling (efficiency.keep_rollouts): it picks rollouts by "
                "their group's reward spread, a GRPO group-baseline notion, and would drop episodes the critic and GAE "
                "are fitted on; use GRPO for down-sampling, or PPO with pre_rollout_filter only"
            )
        super().__init__(*args, **kwargs)
        if self.beta != 0.0:
            raise ValueError(f"PPO puts the KL to the reference in the reward (ppo.kl_coef); set beta=0.0, got beta={self.beta}")
        self.ppo = ppo or PPOSettings()
        self.value_model = value_model.to(self.accelerator.device)
        self.value_optimizer = torch.optim.AdamW([p for p in self.value_model.parameters() if p.requires_grad], lr=self.ppo.value_learning_rate)
        self.ppo_log: list[dict[str, float]] = []

    def _ref_logps(self, output):
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attn = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        keep = output["completion_ids"].size(1)
        unwrapped = self.accelerator.unwrap_model(self.model)
        with torch.no_grad():
            old, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attn, keep)
            if self.ref_model is not None:
                ref, _, _ = self._get_per_token_logps_and_entropies(self.ref_model, ids, attn, keep)
            elif hasattr(unwrapped, "disable_adapter"):
                with unwrapped.disable_adapter():
                    ref, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attn, keep)
            else:
                raise ValueError("PPO's KL penalty needs a reference: train with LoRA (the base is the reference) or pass ref_model")
        return old, ref

    def _generate_and_score_with_policy(self, inputs):
        from agenttune_lib.rl.ppo import completion_values, gae_advantages, token_rewards

        output = super()._generate_and_score_with_policy(inputs)
        scores = self._last_rewards.to(self.accelerator.device).float()
        mask = output["completion_mask"] * output["tool_mask"] if "tool_mask" in output else output["completion_mask"]
        mask = mask.float()
        old, ref = self._ref_logps(output)
        if output.get("old_per_token_logps") is None:
            output["old_per_token_logps"] = old  # the ratio's denominator stays the sampling policy across epochs
        self.value_model.eval()
        with torch.no_grad():
            values = completion_values(self.value_model, output["prompt_ids"], output["prompt_mask"], output["completion_ids"], output["completion_mask"]).float() * mask
        rewards, kl = token_rewards(scores, output["old_per_token_logps"].float(), ref.float(), mask, self.ppo.kl_coef)
        adv, returns = gae_advantages(rewards, values, mask, self.ppo.gamma, self.ppo.lam)
        if self.ppo.whiten_advantages and mask.sum() > 1:
            mean = (adv * mask).sum() / mask.sum()
            var = (((adv - mean) * mask) ** 2).sum() / mask.sum()
            adv = (adv - mean) / (var.sqrt() + 1e-8) * mask
        output["advantages"] = adv.to(output["completion_ids"].device)
        output["ppo_old_values"] = values
        output["ppo_returns"] = returns
        m = self._metrics["train"]
        m["ppo/kl_to_ref"].append(float((kl * mask).sum() / mask.sum().clamp(min=1)))
        m["ppo/mean_value"].append(float((values * mask).sum() / mask.sum().clamp(min=1)))
        return output

    def _compute_loss(self, model, inputs):
        from agenttune_lib.rl.ppo import completion_values, value_loss

        policy_loss = super()._compute_loss(model, inputs)
        mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
        mask = mask.float()
        # The critic has its own optimizer: one clipped-value step per policy step, on the same minibatch.
        self.value_model.train()
        values = completion_values(self.value_model, inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"], inputs["completion_mask"]).float()
        vf_loss, vf_clip = value_loss(values, inputs["ppo_old_values"], inputs["ppo_returns"], mask, self.ppo.cliprange_value)
        self.value_optimizer.zero_grad()
        (self.ppo.vf_coef * vf_loss).backward()
        self.value_optimizer.step()
        m = self._metrics["train"]
        clip = m.get("clip_ratio/region_mean") or [0.0]
        stats = {"step": float(self.state.global_step), "policy_loss": float(policy_loss.detach()), "value_loss": float(vf_loss.detach()),
                 "clip_frac": float(clip[-1]), "value_clip_frac": vf_clip}
        self.ppo_log.append(stats)
        m["ppo/value_loss"].append(stats["value_loss"])
        m["ppo/value_clip_frac"].append(vf_clip)
        return policy_loss


class TrlAgenticRLOO(RLOOTrainer):
    """TRL RLOO; with ``rollout_func`` its generation is the agentic tool loop and tool tokens carry no loss."""

    def __init__(self, *args: Any, rollout_func: Callable[..., dict[str, Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agentic_rollout = rollout_func
        self._env_mask: list[list[int]] | None = None
        self.reward_log: list[tuple[int, float, float]] = []
        self._t0 = time.perf_counter()

    def _generate(self, prompts: list):
        if self.agentic_rollout is None:
            return super()._generate(prompts)
        out = self.agentic_rollout(prompts, self)
        self._env_mask = out["env_mask"]
        # Reward functions see the episode as messages (assistant turns and tool results), and the
        # rollout's per-episode fields (env_reward, tool_call_counts, truncated) as columns.
        for row, i in zip(self._agentic_inputs or [], range(len(prompts))):
            for key in ("agent_completions", "env_reward", "env_success", "tool_call_counts", "truncated", "trajectory_ids"):
                if key in out:
                    row[key] = out[key][i]
        conversational = not isinstance(prompts[0], str)
        completions = out["agent_completions"] if conversational else [
            "\n".join(str(m.get("content", "")) for m in c) for c in out["agent_completions"]
        ]
        return out["prompt_ids"], out["completion_ids"], completions

    def _generate_and_score_completions(self, inputs):
        self._agentic_inputs = inputs
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._agentic_inputs = None
        if self._env_mask is not None:
            width = output["completion_mask"].shape[1]
            env = torch.tensor([(m + [0] * width)[:width] for m in self._env_mask], device=output["completion_mask"].device)
            output["completion_mask"] = output["completion_mask"] * env.to(output["completion_mask"].dtype)
            self._env_mask = None
        rewards = self._metrics["train"].get("reward") or [float("nan")]
        self.reward_log.append((int(self.state.global_step), float(rewards[-1]), time.perf_counter() - self._t0))
        return output


class TrlAgenticDPO(DPOTrainer):
    """TRL DPO over prompt/chosen/rejected rows (offline, or reward-ranked pairs from rollouts).

    Chosen/rejected episodes keep their tool results as context: tool-message tokens carry no loss.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from agenttune_lib.rl.data import tool_turn_keep_mask

        if "completion_mask" in inputs:
            keep = tool_turn_keep_mask(inputs["input_ids"], self.processing_class).to(inputs["completion_mask"].device)
            inputs = {**inputs, "completion_mask": inputs["completion_mask"] * keep.to(inputs["completion_mask"].dtype)}
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)


class TrlAgenticBCO(KTOTrainer):
    """Binary Classifier Optimization (Jung et al. 2024) over unpaired prompt/completion/label rows.

    Loss: -log σ(β·r - δ) for desirable and -log σ(-(β·r - δ)) for undesirable completions,
    r the policy/reference log-ratio and δ a running mean of the implicit rewards.
    """

    def __init__(self, *args: Any, delta_momentum: float = 0.9, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delta_momentum = delta_momentum
        self.bco_delta = 0.0

    def _sequence_logps(self, model, batch) -> torch.Tensor:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits[:, :-1].float()
        from agenttune_lib.rl.data import tool_turn_keep_mask

        targets = batch["input_ids"][:, 1:]
        keep = tool_turn_keep_mask(batch["input_ids"], self.processing_class).to(batch["completion_mask"].device)
        mask = (batch["completion_mask"] * keep)[:, 1:].float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return (lp * mask).sum(-1)

    def _compute_loss(self, model, inputs, return_outputs):
        mode = "train" if self.model.training else "eval"
        batch = {k: (v.to(self.accelerator.device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        labels = torch.as_tensor(batch["label"], dtype=torch.bool, device=self.accelerator.device)
        logps = self._sequence_logps(model, batch)
        with torch.no_grad():
            unwrapped = self.accelerator.unwrap_model(self.model)
            if self.ref_model is not None:
                ref_logps = self._sequence_logps(self.ref_model, batch)
            else:
                with unwrapped.disable_adapter():
                    ref_logps = self._sequence_logps(model, batch)
        rewards = self.beta * (logps - ref_logps)
        delta = torch.tensor(self.bco_delta, device=rewards.device)
        losses = torch.where(labels, -F.logsigmoid(rewards - delta), -F.logsigmoid(-(rewards - delta)))
        loss = losses.mean()
        if mode == "train":
            self.bco_delta = self.delta_momentum * self.bco_delta + (1 - self.delta_momentum) * float(rewards.detach().mean())
        m = self._metrics[mode]
        if labels.any():
            m["rewards/chosen"].append(float(rewards[labels].detach().mean()))
        if (~labels).any():
            m["rewards/rejected"].append(float(rewards[~labels].detach().mean()))
        m["bco/delta"].append(self.bco_delta)
        return (loss, {"rewards": rewards}) if return_outputs else loss
