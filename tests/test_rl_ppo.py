"""Real PPO: GAE against a hand computation, KL-shaped token rewards, clipped value loss, and the ratio clip acting
in the second epoch over a batch; efficiency options that cannot combine refuse."""
from __future__ import annotations

import pytest
import torch

from _rl_helpers import calculator, length_reward

pytest.importorskip("trl")


def test_gae_matches_a_hand_computation_and_skips_tool_tokens():
    from agenttune_lib.rl.ppo import gae_advantages

    # Action tokens at 0, 1 and 4; positions 2-3 are a tool result (no action, no value step).
    rewards = torch.tensor([[0.0, 0.0, 9.0, 9.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 7.0, 7.0, 0.4]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    # By hand: δ2 = 1 − 0.4 = 0.6; δ1 = 0.9·0.4 − 0.2 = 0.16; δ0 = 0.9·0.2 − 0.5 = −0.32
    # A2 = 0.6; A1 = 0.16 + 0.72·0.6 = 0.592; A0 = −0.32 + 0.72·0.592 = 0.10624
    assert adv[0].tolist() == pytest.approx([0.10624, 0.592, 0.0, 0.0, 0.6], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.60624, 0.792, 0.0, 0.0, 1.0], abs=1e-6)
    # γ = λ = 1 is the Monte-Carlo return minus the value
    adv, _ = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.5, 0.8, 0.0, 0.0, 0.6], abs=1e-6)


def test_token_rewards_put_kl_on_every_action_and_the_score_on_the_last():
    from agenttune_lib.rl.ppo import token_rewards

    logps = torch.tensor([[-1.0, -2.0, -3.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    r, kl = token_rewards(torch.tensor([2.0]), logps, ref, mask, kl_coef=0.1)
    assert kl[0].tolist() == pytest.approx([0.5, 0.0, -1.0, 0.0])
    assert r[0].tolist() == pytest.approx([-0.05, 0.0, 0.1 + 2.0, 0.0])


def test_value_loss_is_clipped():
    from agenttune_lib.rl.ppo import value_loss

    old = torch.tensor([[0.0, 0.0]])
    new = torch.tensor([[1.0, 0.1]])
    ret = torch.tensor([[0.0, 1.0]])
    loss, frac = value_loss(new, old, ret, torch.ones(1, 2), clip=0.2)
    # token 0: unclipped (1−0)²=1, clipped (0.2−0)²=0.04 → 1; token 1: (0.1−1)²=0.81, clipped same (inside range) → 0.81
    assert float(loss) == pytest.approx(0.5 * (1.0 + 0.81) / 2)
    assert frac == 0.0
    loss, frac = value_loss(torch.tensor([[-1.0]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.ones(1, 1), clip=0.2)
    assert float(loss) == pytest.approx(0.5 * 4.0) and frac == 0.0
    loss, frac = value_loss(torch.tensor([[0.9]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.ones(1, 1), clip=0.2)
    assert float(loss) == pytest.approx(0.5 * 0.64) and frac == 1.0  # the clipped error (0.8²) is the larger one


def _ppo(**extra):
    from datasets import Dataset

    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl import build_value_model, create_agentic_trainer

    model, tok = build_tiny_model(seed=4)
    kw = dict(
        max_steps=2, per_device_train_batch_size=4, learning_rate=5e-2, num_generations=2, max_completion_length=6,
        reward_funcs=[length_reward], tools=[calculator], value_model=build_value_model(model), num_iterations=2, epsilon=0.05,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}]} for i in range(2)]),
    )
    kw.update(extra)
    return create_agentic_trainer("ppo", model=model, tokenizer=tok, **kw)


def test_ppo_clip_acts_after_the_first_epoch_and_the_critic_learns():
    trainer = _ppo()
    critic_before = {k: v.detach().clone() for k, v in trainer.value_model.named_parameters()}
    trainer.train()
    log = trainer.ppo_log
    assert len(log) == 2
    assert log[0]["clip_frac"] == 0.0  # epoch 1: the policy is still the sampling policy, ratio = 1
    assert log[1]["clip_frac"] > 0.0  # epoch 2 on the same batch: the ratio moved past 1 ± ε
    assert all(x["value_loss"] > 0 for x in log)
    assert any(not torch.equal(critic_before[k], v.detach()) for k, v in trainer.value_model.named_parameters())
    assert trainer.args.num_iterations == 2 and trainer.beta == 0.0
    assert any("ppo/kl_to_ref" in h for h in trainer.state.log_history)


def test_ppo_refuses_what_it_cannot_combine():
    from agenttune_lib.rl import EfficiencyConfig

    with pytest.raises(ValueError, match="down-sampling"):
        _ppo(efficiency=EfficiencyConfig(pre_rollout_filter=False, keep_rollouts=2), num_generations=4)
    with pytest.raises(ValueError, match="kl_coef"):
        _ppo(beta=0.1)
    _ppo(efficiency=EfficiencyConfig(pre_rollout_filter=True))  # the filter only skips prompts: allowed


def test_grpo_refuses_downsampling_that_keeps_every_rollout():
    from agenttune_lib.rl import EfficiencyConfig

    with pytest.raises(ValueError, match="below num_generations"):
        from datasets import Dataset

        from agenttune_lib.models.tiny import build_tiny_model
        from agenttune_lib.rl import create_agentic_trainer

        model, tok = build_tiny_model(seed=4)
        create_agentic_trainer("grpo", model=model, tokenizer=tok, reward_funcs=[length_reward], num_generations=2,
                               per_device_train_batch_size=2, efficiency=EfficiencyConfig(keep_rollouts=2),
                               train_dataset=Dataset.from_list([{"prompt": "x"}] * 2))


def test_rloo_refuses_efficiency():
    from datasets import Dataset

    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl import EfficiencyConfig, create_agentic_trainer

    model, tok = build_tiny_model(seed=4)
    with pytest.raises(ValueError, match="rloo cannot take efficiency"):
        create_agentic_trainer("rloo", model=model, tokenizer=tok, reward_funcs=[length_reward], efficiency=EfficiencyConfig(),
                               train_dataset=Dataset.from_list([{"prompt": "x"}] * 2), num_generations=2)
