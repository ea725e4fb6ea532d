"""The gate's replay of served failures: each corrected served request is re-generated (greedy, and under its tools'
schemas when it was served with structured tool calls) from its conversation by the baseline and by the candidate, and passes when the reply is the reviewer's correction (the same tool calls, by name
and arguments, or the same text). Outcome rows have the shape of ``closed_loop.replay`` rows, so the replay arm scores them."""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agenttune_lib.closed_loop.types import TrainingExample, stable_id

#: A served reply's tool call, as the service renders it (``service.tools`` sits above the closed loop).
CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)

__all__ = ["served_examples", "served_failure_outcomes", "same_reply"]


def served_examples(examples: Sequence[TrainingExample]) -> list[TrainingExample]:
    """The batch's examples that came from served-traffic feedback (their origin is ``feedback:<request id>``)."""
    return [e for e in examples if str(e.metadata.get("origin") or "").startswith("feedback:")]


def _calls(text: str) -> list[tuple[str, str]] | None:
    calls = []
    for m in CALL_RE.finditer(text or ""):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        calls.append((str(obj.get("name")), json.dumps(obj.get("arguments", {}), sort_keys=True)))
    return calls


def same_reply(reply: str, correction: str) -> bool:
    """A tool-call correction matches the same calls (name and arguments, in order); a text correction the same text."""
    want = _calls(correction)
    if want:
        return _calls(reply) == want
    return reply.strip() == correction.strip()


def served_failure_outcomes(base: str | Path, adapter_path: str | Path | None, examples: Sequence[TrainingExample],
                            max_new_tokens: int | None = None) -> list[dict[str, Any]]:
    """Replay rows (kind ``failure``) of the served examples under base + adapter (None: the bare base)."""
    served = served_examples(examples)
    if not served:
        return []
    from agenttune_lib.models.generate import ChatGenerator, GenerationConfig
    from agenttune_lib.models.serving import load_served

    model, tokenizer = load_served(base, adapter_path)
    out = []
    for e in served:
        specs = e.metadata.get("tool_specs") or []
        structured = bool(e.metadata.get("structured_tool_calls") and specs)
        budget = max_new_tokens or len(tokenizer(e.chosen, add_special_tokens=False)["input_ids"]) + 8
        if structured and not max_new_tokens:
            # Constrained decoding may spell a value in more tokens than the correction's own tokenization.
            from agenttune_lib.models.constrained import schema_token_budget, tool_call_schema

            budget = max(budget, schema_token_budget(tool_call_schema(specs)) + 24)
        cfg = GenerationConfig(max_new_tokens=budget, stop_strings=("</tool_call>",), constrained=structured,
                               tool_schemas=tuple(specs) if structured else None, allow_text=bool(e.metadata.get("allow_text", True)))
        gen = ChatGenerator(model, tokenizer, cfg)(list(e.prompt))
        ok = same_reply(gen.text, e.chosen)
        out.append({"case_id": stable_id("served-failure", e.example_id), "kind": "failure", "status": "completed", "label": None,
                    "routed_to_review": None, "stage_correct": {"reply": ok}, "stage_outputs": {"reply": gen.text},
                    "verdict_correct": None, "loop_collapse": False, "step_limit": False, "error": False, "passed": ok,
                    "served_request_id": e.trajectory_id})
    return out
