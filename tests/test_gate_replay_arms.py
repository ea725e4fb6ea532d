"""The gate's generative replay in two processes gives, arm for arm, the outcomes of replaying the arms in turn.

Real DECIDE templates and inputs, a tiny checkpoint as the baseline and a LoRA adapter on it (random, non-zero) as
the candidate, so the two arms reach different verdicts and a swap of arms would show.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agenttune_lib.closed_loop.gate import GateConfig
from agenttune_lib.closed_loop.replay import ReplayCase
from agenttune_lib.closed_loop.service import replay_arms
from agenttune_lib.decide.registry import TemplateRegistry

pytestmark = pytest.mark.timeout(600)

TEMPLATES = ("bfsi/card_decline", "generic/classification")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(base checkpoint dir, adapter dir): the tiny model, and a LoRA adapter on it whose B matrices are not zero."""
    import torch
    from peft import LoraConfig, get_peft_model

    from agenttune_lib.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("replay")
    model, tok = build_tiny_model()
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    torch.manual_seed(1)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False))
    peft.save_pretrained(root / "adapter")
    return str(root / "base"), str(root / "adapter")


def _cases() -> list[ReplayCase]:
    registry = TemplateRegistry()
    out = []
    for template in TEMPLATES:
        for i, (inp, labels) in enumerate(registry.get(template).labelled_examples[:3]):
            text = inp if isinstance(inp, str) else json.dumps(inp)
            out.append(ReplayCase(f"{template}#{i}", "holdout", template, text, {}, accepted_labels=labels))
    return out


def test_two_processes_replay_each_arm_as_in_turn(checkpoints):
    base, adapter = checkpoints
    cases = _cases()
    in_turn = replay_arms(base, None, adapter, cases, workers=1)
    at_once = replay_arms(base, None, adapter, cases, workers=2)
    assert at_once == in_turn
    old, new = in_turn
    assert [o["case_id"] for o in old] == [c.case_id for c in cases] == [o["case_id"] for o in new]
    # the arms reach different verdicts, so a swap of arms would be seen
    assert [o["label"] for o in old] != [o["label"] for o in new]


def test_replay_workers_must_be_a_positive_integer():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="replay_workers"):
            GateConfig(replay_workers=bad)


def test_a_main_module_spawn_cannot_import_falls_back_to_replaying_in_turn(checkpoints):
    """A script read from stdin cannot be re-imported by a spawned process: the pool breaks, and the arms replay in turn."""
    import subprocess
    import sys

    base, adapter = checkpoints
    script = (
        "import json, sys\n"
        "sys.path.insert(0, {tests!r})\n"
        "from test_gate_replay_arms import _cases\n"
        "from agenttune_lib.closed_loop.service import replay_arms\n"
        "print(json.dumps(replay_arms({base!r}, None, {adapter!r}, _cases(), workers=2)))\n"
    ).format(tests=str(Path(__file__).parent), base=base, adapter=adapter)
    proc = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "replaying the arms in turn" in proc.stderr
    old, new = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [old, new] == json.loads(json.dumps(replay_arms(base, None, adapter, _cases(), workers=1)))
