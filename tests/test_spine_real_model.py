"""The five strategies with the real packaged SmolLM2-135M-Instruct, on DictToolHarness and the τ² harness (slow)."""
from __future__ import annotations

import pytest

from agenttune_lib.events import EventKind
from agenttune_lib.spine import (
    DictToolHarness,
    MemoryReActStrategy,
    PlanExecuteStrategy,
    ReActStrategy,
    ReflexionStrategy,
    Tau2RetailHarness,
    TreeOfThoughtsStrategy,
    load_tau2_tasks,
    run_episode,
    run_reflexion,
)
from agenttune_lib.spine.memory import InContextMemory
from _spine_helpers import shared_base_model_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from agenttune_lib.models.base import ensure_base_model
    from agenttune_lib.models.generate import load_chat_generator

    info = ensure_base_model(shared_base_model_dir())
    return load_chat_generator(info.path, max_new_tokens=12, num_threads=1)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _run(kind, model, harness, task):
    common = dict(max_steps=1, tool_format="compact", max_tool_chars=400)
    if kind == "react":
        return run_episode(ReActStrategy(model, **common), harness, task)
    if kind == "plan":
        return run_episode(PlanExecuteStrategy(model, **common), harness, task)
    if kind == "reflexion":
        return run_reflexion(ReflexionStrategy(model, max_attempts=2, **common), harness, task)
    if kind == "memory":
        return run_episode(MemoryReActStrategy(model, InContextMemory(), **common), harness, task)
    return run_episode(TreeOfThoughtsStrategy(model, n_candidates=2, **common), harness, task)


@pytest.mark.parametrize("kind", ["react", "plan", "reflexion", "memory", "tot"])
def test_real_model_runs_every_strategy_on_both_harnesses(smollm2, kind):
    calls_before = smollm2.calls
    dict_log = _run(kind, smollm2, DictToolHarness({"add": add}, max_steps=1), {"prompt": "What is 2 + 3?", "answer": "5"})
    tau2_log = _run(kind, smollm2, Tau2RetailHarness(max_steps=1, include_policy=False), load_tau2_tasks("train")[0])
    assert smollm2.calls > calls_before
    for log in (dict_log, tau2_log):
        assert log.tier == "full" and log.token_ids
        assert log[0].kind is EventKind.OBSERVATION and log.filter(EventKind.TURN_COMPLETE)
        agent = [e for e in log if e.kind in (EventKind.TEXT, EventKind.TOOL_CALL)]
        assert agent and all(e.token_span is not None and len(e.logprobs) == e.token_span[1] - e.token_span[0] for e in agent)
        assert len(log.rewards("episode")) == 1
