"""BFCL suite: two decoders side by side, per category, never an overall that rewards silence.

``strict``: BFCL's own prompt and output decoding (a Python call list), so scores compare with the
public leaderboard. ``platform``: the platform's tool-contract system prompt and its
``<tool_call>`` JSON decoding. Irrelevance categories are scored (no call is correct) and reported
as their own categories. The token budget is at least 256 new tokens and covers the longest
ground-truth call list of the chosen items. All prompts of an arm go through one batched call.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agenttune_lib.evaluation.lockstep import batch_fn
from agenttune_lib.evaluation.suites.common import SuiteResult, config_hash, decoding_of, policy_stats

__all__ = ["BFCLSuiteConfig", "run_bfcl_suite", "platform_tools", "ARMS", "MIN_NEW_TOKENS"]

#: ``constrained`` (opt-in): the platform arm under structured decoding (xgrammar), one valid call or plain text per reply.
ARMS = ("strict", "platform", "constrained")
MIN_NEW_TOKENS = 256


@dataclasses.dataclass(frozen=True)
class BFCLSuiteConfig:
    """Categories, items per category (first n, or a seeded sample), which decoder arms, and the new-token budget."""

    categories: tuple[str, ...] = ("simple_python", "multiple", "parallel", "irrelevance")
    limit: int | None = 50
    sample_seed: int | None = 0
    arms: tuple[str, ...] = ("strict", "platform")
    max_new_tokens: int = MIN_NEW_TOKENS

    def __post_init__(self) -> None:
        object.__setattr__(self, "categories", tuple(self.categories))
        object.__setattr__(self, "arms", tuple(self.arms))
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise ValueError(f"arms must be a non-empty subset of {ARMS}, got {list(self.arms)}")
        if self.max_new_tokens < MIN_NEW_TOKENS:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} is under {MIN_NEW_TOKENS}: correct parallel answers would be cut off")


def platform_tools(functions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL functions as OpenAI tool specs with JSON Schema parameters (``dict`` -> ``object``, ``float`` -> ``number``)."""
    from agenttune_lib.evaluation.schemas import to_json_schema

    return [{"type": "function", "function": {"name": f["name"], "description": f.get("description", ""),
                                              "parameters": to_json_schema(f.get("parameters") or {"type": "object", "properties": {}})}}
            for f in functions]


def _messages(entry: Any, arm: str, template: str) -> list[dict[str, Any]]:
    from agenttune_lib.evaluation.bfcl.prompt import bfcl_system_prompt
    from agenttune_lib.spine.prompts import system_prompt

    user = [m for m in entry.messages if m.get("role") != "system"]
    own_system = "\n\n".join(str(m.get("content", "")) for m in entry.messages if m.get("role") == "system")
    if arm == "strict":
        system = bfcl_system_prompt(entry.functions, template)
    else:
        system = system_prompt(platform_tools(entry.functions))
    if own_system:
        system = system + "\n\n" + own_system
    return [{"role": "system", "content": system}, *user]


def _token_budget(entries: Sequence[Any], config: BFCLSuiteConfig, tokenizer: Any) -> int:
    """At least the configured budget, and 1.5x the longest ground truth (as a Python call list) in tokens, when a tokenizer is known."""
    from agenttune_lib.evaluation.bfcl.checker import ground_truth_calls
    from agenttune_lib.evaluation.bfcl.decode import render_python_calls

    longest = 0
    for e in entries:
        if e.ground_truth is not None:
            text = render_python_calls(ground_truth_calls(e))
            longest = max(longest, len(tokenizer(text, add_special_tokens=False)["input_ids"]) if tokenizer is not None else len(text) // 3)
    return max(config.max_new_tokens, int(longest * 1.5) + 16)


def _by_toolset(policy: Any, entries: Sequence[Any], convs: Sequence[Any]) -> list[Any]:
    """Constrained generation batched over entries that offer the same functions (one grammar per batch)."""
    import json

    groups: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        groups.setdefault(json.dumps(e.functions, sort_keys=True), []).append(i)
    out: list[Any] = [None] * len(entries)
    for idx in groups.values():
        for i, g in zip(idx, policy.generate_batch([convs[i] for i in idx], tools=platform_tools(entries[idx[0]].functions))):
            out[i] = g
    return out


def run_bfcl_suite(
    policy: Any, config: BFCLSuiteConfig | None = None, entries: Sequence[Any] | None = None, decoding: Mapping[str, Any] | None = None
) -> dict[str, SuiteResult]:
    """One ``SuiteResult`` per decoder arm (suite names ``bfcl_strict`` / ``bfcl_platform``), rows per item with its category.

    A batched policy (``generate_batch``) gets the whole arm in one call, with no stop string
    (parallel answers hold several calls) and the suite's token budget.
    """
    from agenttune_lib.evaluation.bfcl.checker import check_entry_output
    from agenttune_lib.evaluation.bfcl.data import load_bfcl
    from agenttune_lib.evaluation.bfcl.prompt import bfcl_system_prompt_template

    config = config or BFCLSuiteConfig()
    if entries is None:
        entries = [e for cat in config.categories for e in load_bfcl(cat, limit=config.limit, sample_seed=config.sample_seed)]
    entries = list(entries)
    if not entries:
        raise ValueError(f"BFCL suite selects no entries (categories={list(config.categories)}, limit={config.limit})")
    template = bfcl_system_prompt_template()
    budget = _token_budget(entries, config, getattr(policy, "tokenizer", None))
    out: dict[str, SuiteResult] = {}
    for arm in config.arms:
        convs = [_messages(e, arm, template) for e in entries]
        start = time.perf_counter()
        if arm == "constrained" and not hasattr(policy, "generate_batch"):
            raise TypeError("the constrained arm needs a model policy with generate_batch (e.g. BatchedChatPolicy)")
        if hasattr(policy, "generate_batch"):
            saved = (policy.max_new_tokens, policy.stop_strings, getattr(policy, "constrained", False))
            policy.max_new_tokens, policy.stop_strings = budget, ()
            policy.constrained = arm == "constrained"
            try:
                if arm == "constrained":
                    gens = _by_toolset(policy, entries, convs)
                else:
                    gens = policy.generate_batch(convs)
            finally:
                policy.max_new_tokens, policy.stop_strings, policy.constrained = saved
        else:
            gens = batch_fn(policy)(convs)
        rows = []
        for e, g in zip(entries, gens):
            text = g if isinstance(g, str) else g.text
            res = check_entry_output(e, text, decoder="platform" if arm == "constrained" else arm)
            rows.append({"item_id": e.id, "category": e.category, "output": text, "score": float(res.valid), "success": res.valid,
                         "excluded": False, "error_type": res.error_type, "metrics": {"error": res.error[:300]} if res.error else {}})
        extra = {"arm": arm, "max_new_tokens_used": budget, "system_prompt": "bfcl_default_python" if arm == "strict" else "platform_tool_contract",
                 "structured_decoding": arm == "constrained",
                 "decoding": {k: v for k, v in decoding_of(policy, decoding).items() if k != "max_new_tokens"}}
        record = {**dataclasses.asdict(config), **extra, "n_per_category": {c: sum(1 for e in entries if e.category == c) for c in config.categories},
                  "policy": policy_stats(policy)}
        name = f"bfcl_{arm}"
        out[name] = SuiteResult(name, rows, record, config_hash(name, config, [e.id for e in entries], extra), time.perf_counter() - start)
    return out
