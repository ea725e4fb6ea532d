"""The Ray rollout engine: two actors generate rollouts in parallel and receive pushed LoRA weights."""
from __future__ import annotations

import os

import pytest

from _rl_helpers import calculator, length_reward, lora_changed, lora_snapshot

pytestmark = pytest.mark.slow


@pytest.fixture
def local_ray():
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.pop("RAY_ADDRESS", None)
    import ray

    import _rl_helpers
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(_rl_helpers)  # test helpers travel to the actors by value
    ray.init(num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()


def test_ray_engine_rolls_out_in_two_actors_and_syncs_weights(local_ray, tmp_path):
    from datasets import Dataset

    from agenttune_lib.models.tiny import build_tiny_model, save_tiny_model
    from agenttune_lib.rl import RayRolloutEngine, RolloutConfig, create_agentic_trainer

    path = save_tiny_model(tmp_path / "tiny")
    engine = RayRolloutEngine(str(path), num_actors=2, config=RolloutConfig(max_new_tokens=6, max_tool_turns=1), lora={"r": 8, "lora_alpha": 16})
    out = engine.rollout([f"What is {i}+1?" for i in range(4)], tools=[calculator], reward_fn=length_reward)
    assert len(set(out["actor_pid"])) == 2
    assert len(out["trajectories"]) == 4 and all(log.tier == "full" for log in out["trajectories"])
    assert set(out["weights_version"]) == {0}

    # A GRPO step with the Ray engine: the trainer pushes its LoRA weights to both actors first.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i}+1?"}]} for i in range(4)])
    trainer = create_agentic_trainer(
        "grpo", model=model, tokenizer=tok, train_dataset=data, reward_funcs=[length_reward], tools=[calculator],
        rollout_engine=engine, lora={"r": 8, "lora_alpha": 16}, num_generations=2, per_device_train_batch_size=4,
        max_completion_length=6, max_steps=2, learning_rate=5e-2, beta=0.0,
    )
    before = lora_snapshot(trainer.model)
    trainer.train()
    assert lora_changed(before, trainer.model)
    assert engine.version == 2  # weights pushed before each of the two generation steps
    # The actors hold the trainer's adapter and weights: sampling and trainer logprobs agree, the correction is ~1.
    assert [r["step"] for r in trainer.importance_log] == [0, 1]
    assert all(r["logp_gap_max"] < 1e-3 and abs(r["ratio_mean"] - 1.0) < 1e-3 for r in trainer.importance_log)
    after = engine.rollout(["What is 1+1?", "What is 2+1?"], tools=[calculator])
    assert set(after["weights_version"]) == {2} and len(set(after["actor_pid"])) == 2
    engine.shutdown()


def test_actors_whose_lora_differs_from_the_trainers_are_refused(local_ray, tmp_path):
    """Issue 29: q/v-only actors under an all-linear trainer sampled off-policy (up to 0.86 nats) without a word."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl import RayRolloutEngine, RolloutConfig, create_agentic_trainer
    from agenttune_lib.rl.lora import LoraMismatch

    path = save_tiny_model(tmp_path / "tiny")
    engine = RayRolloutEngine(str(path), num_actors=1, config=RolloutConfig(max_new_tokens=4, max_tool_turns=1),
                              lora={"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]})
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 1+1?"}]}] * 2)
    with pytest.raises(LoraMismatch) as err:
        create_agentic_trainer("grpo", model=model, tokenizer=tok, train_dataset=data, reward_funcs=[length_reward], tools=[calculator],
                               rollout_engine=engine, lora={"r": 8, "lora_alpha": 16}, num_generations=2, per_device_train_batch_size=2,
                               max_completion_length=4, max_steps=1, beta=0.0)
    msg = str(err.value)
    assert msg.startswith("Ray rollout actor 0 LoRA config differs from the trainer's in ['adapted_modules', 'target_modules']: trainer lora={")
    assert "'target_modules': ['q_proj', 'v_proj']" in msg and "'target_modules': ['down_proj', 'gate_proj', 'k_proj'" in msg
    engine.shutdown()


def test_a_training_task_holds_every_cpu_but_the_reserved_and_computes_on_them(local_ray):
    from agenttune_lib.rl.ray_engine import node_cpus, run_on_ray

    _torch_threads = lambda: __import__("torch").get_num_threads()  # noqa: E731  a lambda travels by value to the worker
    assert node_cpus() == 2.0
    assert run_on_ray(_torch_threads) == 1  # the default task: one CPU, one thread
    assert run_on_ray(_torch_threads, num_cpus=None) == 2  # the whole node
    assert run_on_ray(_torch_threads, num_cpus=None, reserve_cpus=1.0) == 1  # one CPU left for the task's actors
