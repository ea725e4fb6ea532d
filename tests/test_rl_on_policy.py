"""RL that is on-policy or says it is not (issue 29): LoRA mismatch refused, sampling logprobs importance-correct, vLLM refused."""
from __future__ import annotations

import copy
import math

import pytest

from _rl_helpers import calculator, length_reward

QV = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
ALL = {"r": 8, "lora_alpha": 16}


def _peft(lora):
    from peft import get_peft_model

    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl.lora import lora_config

    model, tok = build_tiny_model(seed=0)
    return get_peft_model(model, lora_config(lora)), tok


class CopyEngine:
    """Test double for a Ray actor in process: its own PEFT copy of the policy, weights pushed by the trainer."""

    receives_weights = True

    def __init__(self, lora, temperature=1.0):
        from agenttune_lib.rl.rollout import RolloutConfig, TransformersRolloutEngine

        model, tok = _peft(lora)
        self.inner = TransformersRolloutEngine(model, tok, RolloutConfig(max_new_tokens=5, max_tool_turns=1, temperature=temperature))
        self.tokenizer, self.config, self.version = tok, self.inner.config, 0

    def rollout(self, prompts, **kwargs):
        out = self.inner.rollout(prompts, **kwargs)
        out["weights_version"] = [self.version] * len(prompts)
        return out

    def require_policy_match(self, model):
        from agenttune_lib.rl.lora import lora_signature, require_same_lora

        require_same_lora(lora_signature(model), lora_signature(self.inner.model), engine_name="copy engine")

    def push_weights(self, state):
        self.inner.load_adapter_state(state)
        self.version += 1


def _data(n=2):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i}+1?"}]} for i in range(n)])


def _grpo(model, tok, engine, lora=ALL, algorithm="grpo", **kw):
    from agenttune_lib.rl import create_agentic_trainer

    base = dict(num_generations=2, per_device_train_batch_size=2, max_completion_length=5, max_steps=1, beta=0.0)
    if algorithm == "rloo":
        base = dict(num_generations=2, per_device_train_batch_size=2, max_completion_length=5, max_steps=1)
    return create_agentic_trainer(algorithm, model=model, tokenizer=tok, train_dataset=_data(), reward_funcs=[length_reward],
                                  tools=[calculator], rollout_engine=engine, lora=lora, **{**base, **kw})


# 1. LoRA configs must match --------------------------------------------------------------------------------------

def test_differing_lora_targets_are_refused_naming_both_configs():
    from agenttune_lib.rl.lora import LoraMismatch, lora_signature, require_same_lora

    trainer, _ = _peft(ALL)
    actor, _ = _peft(QV)
    t, a = lora_signature(trainer), lora_signature(actor)
    assert a["target_modules"] == ["q_proj", "v_proj"]
    assert set(t["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    with pytest.raises(LoraMismatch) as err:
        require_same_lora(t, a, engine_name="Ray rollout actor 0")
    msg = str(err.value)
    assert "Ray rollout actor 0 LoRA config differs from the trainer's in ['adapted_modules', 'target_modules']" in msg
    assert f"trainer lora={t}" in msg and f"Ray rollout actor 0 lora={a}" in msg
    require_same_lora(t, lora_signature(_peft(ALL)[0]))  # the same config passes


@pytest.mark.parametrize("other, field", [({"r": 4, "lora_alpha": 16}, "'r'"), ({"r": 8, "lora_alpha": 32}, "'lora_alpha'"),
                                          ({**ALL, "target_modules": ["q_proj"], "layers_to_transform": [1]}, "'layers'")])
def test_rank_alpha_and_top_layers_differences_are_refused(other, field):
    from agenttune_lib.rl.lora import LoraMismatch, lora_signature, require_same_lora

    base = {**ALL, "target_modules": ["q_proj"]} if "layers_to_transform" in other else ALL
    with pytest.raises(LoraMismatch, match=field):
        require_same_lora(lora_signature(_peft(base)[0]), lora_signature(_peft(other)[0]))


def test_a_push_that_is_not_exactly_the_engines_adapter_is_refused():
    """PEFT would load the overlapping q/v weights and keep k/o/mlp at init: refuse instead."""
    from peft import get_peft_model_state_dict

    from agenttune_lib.rl.lora import LoraMismatch
    from agenttune_lib.rl.rollout import TransformersRolloutEngine

    engine_model, tok = _peft(ALL)
    trainer_model, _ = _peft(QV)
    eng = TransformersRolloutEngine(engine_model, tok)
    state = get_peft_model_state_dict(trainer_model)
    with pytest.raises(LoraMismatch, match=r"TransformersRolloutEngine: the pushed LoRA weights do not match its adapter \(20 of its 28 parameters missing, 0 unknown, 0 of another shape"):
        eng.load_adapter_state(state)
    eng.load_adapter_state(get_peft_model_state_dict(_peft(ALL)[0]))  # the exact adapter loads


def test_trainer_refuses_an_engine_whose_lora_differs():
    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl.lora import LoraMismatch

    model, tok = build_tiny_model(seed=0)
    with pytest.raises(LoraMismatch, match=r"copy engine LoRA config differs from the trainer's in \['adapted_modules', 'target_modules'\]"):
        _grpo(model, tok, CopyEngine(QV), lora=ALL)


# 2. importance-sampling correction from the recorded sampling logprobs ----------------------------------------------

def _corrector(**kw):
    from agenttune_lib.models.tiny import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    return _grpo(model, tok, CopyEngine(ALL), **kw)


def _output(old, samp, mask, adv):
    import torch

    n, t = len(old), len(old[0])
    return {"prompt_ids": torch.ones(n, 2, dtype=torch.long), "prompt_mask": torch.ones(n, 2, dtype=torch.long),
            "completion_ids": torch.ones(n, t, dtype=torch.long), "completion_mask": torch.tensor(mask),
            "old_per_token_logps": torch.tensor(old), "sampling_per_token_logps": torch.tensor(samp), "advantages": torch.tensor(adv)}


def test_token_truncate_correction_is_trls_ratio_folded_into_the_advantages():
    trainer = _corrector(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=2.0)
    out = trainer._importance_correct(_output([[-1.0, -2.0, 0.0, -0.5]], [[-1.0, -1.0, -2.0, -3.0]], [[1, 1, 1, 0]], [2.0]))
    adv = out["advantages"][0].tolist()
    # ratio = exp(trainer - sampler): 1, e^-1, e^2 truncated to 2.0, and 1 where the mask is 0
    assert adv == pytest.approx([2.0, 2.0 * math.exp(-1.0), 4.0, 2.0])
    rec = trainer.importance_log[-1]
    assert rec["logp_gap_max"] == pytest.approx(2.0) and rec["ratio_max"] == pytest.approx(2.0)


def test_sequence_mask_correction_drops_a_sequence_whose_ratio_exceeds_the_cap():
    trainer = _corrector()  # TRL's defaults: sequence_mask, clip_max 3.0
    assert trainer.args.vllm_importance_sampling_mode == "sequence_mask"
    out = trainer._importance_correct(_output([[-1.0, -1.0], [-1.0, -1.0]], [[-1.5, -1.0], [-3.0, -1.0]], [[1, 1], [1, 1]], [1.0, -1.0]))
    assert out["advantages"][:, 0].tolist() == pytest.approx([math.exp(0.5), 0.0])  # e^2 > 3: masked out
    assert trainer.importance_log[-1]["masked_fraction"] == pytest.approx(0.5)


def test_training_with_an_engine_outside_the_trainer_corrects_every_step():
    """The copy samples at temperature 0.5, the trainer scores at 1.0: a real gap, corrected and logged each step."""
    from agenttune_lib.models.tiny import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    engine = CopyEngine(ALL, temperature=0.5)
    trainer = _grpo(model, tok, engine, max_steps=2, learning_rate=5e-2)
    trainer.train()
    assert engine.version == 2  # weights pushed before each generation
    assert [r["step"] for r in trainer.importance_log] == [0, 1]
    assert all(r["logp_gap_max"] > 0.05 for r in trainer.importance_log)
    assert any("sampling/importance_sampling_ratio/mean" in h for h in trainer.state.log_history)


def test_the_trainers_own_policy_needs_no_correction():
    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl.rollout import RolloutConfig, TransformersRolloutEngine

    model, tok = build_tiny_model(seed=0)
    trainer = _grpo(model, tok, TransformersRolloutEngine(model, tok, RolloutConfig(max_new_tokens=5, max_tool_turns=1)))
    trainer.train()
    assert trainer.importance_log == []


@pytest.mark.parametrize("kw, msg", [
    ({"algorithm": "rloo"}, "rloo's TRL trainer drops the sampling logprobs"),
    ({"vllm_importance_sampling_correction": False}, "vllm_importance_sampling_correction=False with CopyEngine"),
    ({"loss_type": "vespo"}, "loss_type='vespo' cannot take the importance-sampling correction"),
])
def test_an_uncorrectable_outside_engine_is_refused(kw, msg):
    from agenttune_lib.models.tiny import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    with pytest.raises(ValueError, match=msg):
        _grpo(model, tok, CopyEngine(ALL), **kw)


# 3. vLLM and engines that cannot receive weights -------------------------------------------------------------------

def test_vllm_engine_is_refused_for_training_without_vllm_installed():
    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl.rollout import VLLMRolloutEngine

    model, tok = build_tiny_model(seed=0)
    engine = object.__new__(VLLMRolloutEngine)  # the refusal reads the class, before any vLLM call
    with pytest.raises(ValueError, match=r"VLLMRolloutEngine is refused for training: it loads its checkpoint once and never receives"):
        _grpo(model, tok, engine)


def test_trl_use_vllm_is_refused_for_agentic_training():
    from agenttune_lib.models.tiny import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    with pytest.raises(ValueError, match=r"use_vllm=True is refused for agentic training"):
        _grpo(model, tok, None, use_vllm=True)


def test_an_engine_over_another_model_is_refused():
    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl.rollout import TransformersRolloutEngine

    model, tok = build_tiny_model(seed=0)
    other = copy.deepcopy(model)
    with pytest.raises(ValueError, match=r"rollout engine TransformersRolloutEngine cannot receive the trainer's weights"):
        _grpo(model, tok, TransformersRolloutEngine(other, tok))


def test_train_config_refuses_ray_actors_for_an_algorithm_without_the_correction():
    from agenttune_lib.rl.train import TrainConfig

    with pytest.raises(ValueError, match=r"TrainConfig.rollout_actors=2 needs algorithm grpo or ppo"):
        TrainConfig(algorithm="rloo", rollout_actors=2)
    assert TrainConfig(algorithm="ppo", rollout_actors=2).rollout_actors == 2
