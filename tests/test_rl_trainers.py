"""create_agentic_trainer: every algorithm trains one real step on a tiny model; kwargs split by TRL signatures."""
from __future__ import annotations

import math

import pytest

from _rl_helpers import calculator, length_reward, lora_changed, lora_snapshot

pytest.importorskip("trl")


def _prompts():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "answer": str(2 * i)} for i in range(4)])


def _trainer(algo, **extra):
    from datasets import Dataset

    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl import build_value_model, create_agentic_trainer

    model, tok = build_tiny_model(seed=1)
    kw = dict(max_steps=1, per_device_train_batch_size=4, learning_rate=5e-2)
    if algo in ("grpo", "ppo", "rloo"):
        kw.update(num_generations=2, max_completion_length=8, reward_funcs=[length_reward], train_dataset=_prompts(), tools=[calculator])
        if algo == "ppo":
            kw["value_model"] = build_value_model(model)
    elif algo == "dpo":
        row = {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]}
        kw["train_dataset"] = Dataset.from_list([row] * 4)
    else:
        kw["train_dataset"] = Dataset.from_list(
            [{"prompt": [{"role": "user", "content": "2+2?"}], "completion": [{"role": "assistant", "content": "4" if i % 2 else "5"}], "label": bool(i % 2)} for i in range(4)]
        )
    kw.update(extra)
    return create_agentic_trainer(algo, model=model, tokenizer=tok, **kw)


@pytest.mark.parametrize("algo", ["grpo", "ppo", "dpo", "rloo", "bco"])
def test_each_algorithm_trains_one_real_step(algo):
    trainer = _trainer(algo)
    before = lora_snapshot(trainer.model)
    result = trainer.train()
    assert math.isfinite(result.training_loss)
    assert trainer.state.global_step == 1
    assert lora_changed(before, trainer.model), f"{algo}: LoRA weights did not move"
    assert trainer.agenttune_algorithm == algo


def test_unknown_kwarg_names_it_and_the_algorithm():
    with pytest.raises(TypeError, match=r"'grpo'.*\['not_a_trl_option'\]"):
        _trainer("grpo", not_a_trl_option=3)


def test_kwargs_split_between_config_and_trainer():
    from agenttune_lib.rl.factory import split_trl_kwargs

    config_kw, trainer_kw = split_trl_kwargs("GRPO", {"num_generations": 4, "learning_rate": 1e-4, "reward_funcs": [len], "efficiency": None})
    assert set(config_kw) == {"num_generations", "learning_rate"}
    assert set(trainer_kw) == {"reward_funcs", "efficiency"}
    with pytest.raises(ValueError, match="unknown algorithm"):
        split_trl_kwargs("a2c", {})


def test_ppo_requires_a_value_model_and_dpo_rejects_tools():
    with pytest.raises(ValueError, match="value_model"):
        _trainer("ppo", value_model=None)
    with pytest.raises(ValueError, match="offline rows"):
        _trainer("dpo", tools=[calculator])


def test_agentic_grpo_writes_rollouts_to_the_warehouse(warehouse):
    from agenttune_lib.rl import warehouse_sink
    from agenttune_lib.warehouse import Provenance

    sink = warehouse_sink(warehouse, Provenance(run_id="run-rl", asset_key="trained_adapter"))
    trainer = _trainer("grpo", rollout_sink=sink)
    trainer.train()
    logs = warehouse.read_logs(source="rollout")
    assert len(logs) == 4 and {log.tier for log in logs} == {"full"}
    assert all(len(log.rewards(scope="episode")) == 1 for log in logs)  # the trainer's reward travels with each rollout
    assert warehouse.execute("SELECT DISTINCT run_id FROM trajectories WHERE source = 'rollout'") == [("run-rl",)]


def test_efficient_grpo_downsamples_and_logs():
    from agenttune_lib.rl import EfficiencyConfig

    trainer = _trainer("grpo", num_generations=4, per_device_train_batch_size=8, efficiency=EfficiencyConfig(keep_rollouts=2))
    trainer.train()
    stats = trainer.efficiency_log[-1]
    assert stats.rollouts_generated == 8 and stats.rollouts_used == 4
    assert 0.0 <= stats.frac_zero_variance <= 1.0
    logged = [h for h in trainer.state.log_history if "efficiency/rollouts_used" in h]
    assert logged and logged[0]["efficiency/rollouts_used"] == 4.0


def test_a_ready_trl_config_is_accepted_and_keywords_override_it(tmp_path):
    from trl import DPOConfig

    cfg = DPOConfig(output_dir=str(tmp_path / "dpo"), max_steps=1, per_device_train_batch_size=4, use_cpu=True, report_to="none")
    trainer = _trainer("dpo", args=cfg, learning_rate=1e-3)
    assert trainer.args.learning_rate == 1e-3 and trainer.args.max_steps == 1
    with pytest.raises(TypeError, match="DPOConfig"):
        _trainer("dpo", args={"max_steps": 1})


@pytest.mark.parametrize("algo", ["grpo", "rloo"])
def test_a_raising_reward_stops_training_naming_reward_and_item(algo):
    from agenttune_lib.rl.rewards import RewardError

    def broken(completions, answer=None, **kwargs):
        if any("6" in str(a) for a in answer):
            raise RuntimeError("scorer crashed")
        return [0.0] * len(completions)

    trainer = _trainer(algo, reward_funcs=[broken])
    with pytest.raises(RewardError, match=r"'broken' raised on item \d+.*scorer crashed"):
        trainer.train()
