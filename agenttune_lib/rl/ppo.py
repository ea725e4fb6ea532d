"""PPO for agentic rollouts: per-token critic, GAE, KL-to-reference in the reward, several epochs per batch, value clipping.

TRL 1.16 ships no PPOTrainer, so this is written plainly on top of TRL's GRPO parts: its generation
(our agentic rollout function), its reference/old-policy log-probs and its clipped-ratio policy loss
(which accepts per-token advantages) and its ``num_iterations`` batch reuse (the PPO epochs). What TRL
lacks — the token-level value model, GAE, the KL-shaped reward and the clipped value loss — is here.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["PPOSettings", "TokenValueModel", "build_value_model", "gae_advantages", "token_rewards", "value_loss"]


@dataclasses.dataclass
class PPOSettings:
    """PPO knobs that TRL's GRPOConfig has no field for (clip ε and epochs come from GRPOConfig.epsilon/num_iterations)."""

    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.05
    cliprange_value: float = 0.2
    vf_coef: float = 0.5
    value_learning_rate: float = 1e-4
    whiten_advantages: bool = True

    def __post_init__(self) -> None:
        for name in ("gamma", "lam"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"PPOSettings.{name} must be in [0, 1], got {v}")
        if self.kl_coef < 0 or self.cliprange_value <= 0:
            raise ValueError(f"PPOSettings: kl_coef must be >= 0 and cliprange_value > 0, got {self.kl_coef}, {self.cliprange_value}")


class TokenValueModel(torch.nn.Module):
    """A critic: the policy's transformer body (its own copy) with a scalar head on every position."""

    def __init__(self, body: Any, hidden_size: int) -> None:
        super().__init__()
        self.body = body
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden.float()).squeeze(-1)


def build_value_model(policy: Any) -> TokenValueModel:
    """A per-token critic initialised from the policy's (base) weights."""
    import copy

    from transformers import AutoModel

    config = copy.deepcopy(policy.config)
    body = AutoModel.from_config(config)
    base = getattr(policy, "get_base_model", lambda: policy)()
    inner = getattr(base, "model", base)  # CausalLM -> its transformer body
    body.load_state_dict(inner.state_dict(), strict=False)
    return TokenValueModel(body, int(config.hidden_size))


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over each row's action tokens (mask 1); tool/context tokens are skipped.

    ``rewards``, ``values``, ``mask``: (B, T). Returns (advantages, returns), zero off the mask. The value after
    the last action token is 0 (the episode ends).
    """
    adv = torch.zeros_like(values, dtype=torch.float32)
    for b in range(values.shape[0]):
        idx = mask[b].nonzero(as_tuple=True)[0]
        last = 0.0
        for j in range(len(idx) - 1, -1, -1):
            t = int(idx[j])
            next_v = float(values[b, int(idx[j + 1])]) if j + 1 < len(idx) else 0.0
            delta = float(rewards[b, t]) + gamma * next_v - float(values[b, t])
            last = delta + gamma * lam * last
            adv[b, t] = last
    returns = (adv + values.float()) * mask
    return adv * mask, returns


def token_rewards(scores: torch.Tensor, logps: torch.Tensor, ref_logps: torch.Tensor | None, mask: torch.Tensor, kl_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token reward: −kl_coef·(log π_old − log π_ref) on every action token, plus the episode score on the last one.

    Returns (rewards, per-token KL), both (B, T).
    """
    kl = (logps - ref_logps) * mask if ref_logps is not None else torch.zeros_like(logps)
    rewards = -kl_coef * kl
    for b in range(mask.shape[0]):
        idx = mask[b].nonzero(as_tuple=True)[0]
        if len(idx):
            rewards[b, int(idx[-1])] += scores[b]
    return rewards, kl


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float) -> tuple[torch.Tensor, float]:
    """Clipped value loss 0.5·max((V−R)², (V_old + clip(V−V_old, ±c) − R)²) over the mask; and the value clip fraction."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (clipped - returns) ** 2
    n = mask.sum().clamp(min=1)
    loss = 0.5 * (torch.max(loss_unclipped, loss_clipped) * mask).sum() / n
    frac = float(((loss_clipped > loss_unclipped).float() * mask).sum() / n)
    return loss, frac


def completion_values(value_model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """V(state before each completion token): the critic's output at the position preceding it, (B, T)."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attn = torch.cat([prompt_mask, completion_mask], dim=1)
    v = value_model(input_ids=ids, attention_mask=attn)
    t = completion_ids.shape[1]
    return v[:, -t - 1 : -1]
