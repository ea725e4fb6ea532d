"""BFCL suite: two decoders side by side, per category, never an overall that rewards silence.

``strict``: BFCL's own prompt and output decoding (a Python call list), so scores compare with the
public leaderboard. ``platform``: the platform's tool-contract system prompt and its
``<tool_call>`` JSON decoding. Irrelevance categories are scored (no call is correct) and reported
as their own categories. Each category decodes in its own batched call with its own new-token budget:
1.5x its longest ground-truth answer in the arm's rendering plus 16 (so parallel answers fit), or
``no_call_new_tokens`` where no call is correct; a batch runs until its longest row, so one shared
budget sized for parallel answers made single-call categories decode 256 tokens for a 30-token call.
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
#: The floor of every category's budget.
MIN_NEW_TOKENS = 64
#: Budget where no call is correct (irrelevance): room for a declining reply, or for a call that would fail the item.
NO_CALL_NEW_TOKENS = 128


@dataclasses.dataclass(frozen=True)
class BFCLSuiteConfig:
    """Categories, items per category (first n, or a seeded sample), which decoder arms, and the new-token budgets.

    ``max_new_tokens`` None: per category from its ground truth; a number: that budget at least, in every category.
    """

    categories: tuple[str, ...] = ("simple_python", "multiple", "parallel", "irrelevance")
    limit: int | None = 50
    sample_seed: int | None = 0
    arms: tuple[str, ...] = ("strict", "platform")
    max_new_tokens: int | None = None
    no_call_new_tokens: int = NO_CALL_NEW_TOKENS

    def __post_init__(self) -> None:
        object.__setattr__(self, "categories", tuple(self.categories))
        object.__setattr__(self, "arms", tuple(self.arms))
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise ValueError(f"arms must be a non-empty subset of {ARMS}, got {list(self.arms)}")
        for name in ("max_new_tokens", "no_call_new_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < MIN_NEW_TOKENS):
                raise ValueError(f"BFCLSuiteConfig.{name}={value!r} must be an integer of at least {MIN_NEW_TOKENS} new tokens")


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


def _category_budgets(entries: Sequence[Any], config: BFCLSuiteConfig, tokenizer: Any, arm: str) -> dict[str, int]:
    """Per category: 1.5x its longest ground truth in the arm's rendering (a Python call list, or ``<tool_call>`` lines)
    plus 16 tokens, ``no_call_new_tokens`` where it has none; never under MIN_NEW_TOKENS nor a configured ``max_new_tokens``."""
    from agenttune_lib.evaluation.bfcl.checker import ground_truth_calls
    from agenttune_lib.evaluation.bfcl.decode import render_python_calls
    from agenttune_lib.events import render_tool_call

    def size(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) if tokenizer is not None else len(text) // 3

    longest: dict[str, int | None] = {}
    for e in entries:
        longest.setdefault(e.category, None)
        if e.ground_truth is not None:
            calls = ground_truth_calls(e)
            text = render_python_calls(calls) if arm == "strict" else "\n".join(
                render_tool_call({"name": name, "arguments": args}) for call in calls for name, args in call.items())
            longest[e.category] = max(longest[e.category] or 0, size(text))
    floor = max(MIN_NEW_TOKENS, config.max_new_tokens or 0)
    return {cat: max(floor, config.no_call_new_tokens if n is None else int(n * 1.5) + 16) for cat, n in longest.items()}


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

    A batched policy (``generate_batch``) gets one call per category, with no stop string (parallel answers
    hold several calls) and that category's token budget.
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
    out: dict[str, SuiteResult] = {}
    for arm in config.arms:
        convs = [_messages(e, arm, template) for e in entries]
        budgets = _category_budgets(entries, config, getattr(policy, "tokenizer", None), arm)
        start = time.perf_counter()
        if arm == "constrained" and not hasattr(policy, "generate_batch"):
            raise TypeError("the constrained arm needs a model policy with generate_batch (e.g. BatchedChatPolicy)")
        if hasattr(policy, "generate_batch"):
            gens: list[Any] = [None] * len(entries)
            saved = (policy.max_new_tokens, policy.stop_strings, getattr(policy, "constrained", False))
            policy.stop_strings, policy.constrained = (), arm == "constrained"
            try:
                for cat, budget in budgets.items():
                    idx = [i for i, e in enumerate(entries) if e.category == cat]
                    policy.max_new_tokens = budget
                    part = [entries[i] for i in idx]
                    got = _by_toolset(policy, part, [convs[i] for i in idx]) if arm == "constrained" else policy.generate_batch([convs[i] for i in idx])
                    for i, g in zip(idx, got):
                        gens[i] = g
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
        extra = {"arm": arm, "max_new_tokens_used": max(budgets.values()), "max_new_tokens_by_category": budgets, "system_prompt": "bfcl_default_python" if arm == "strict" else "platform_tool_contract",
                 "structured_decoding": arm == "constrained",
                 "decoding": {k: v for k, v in decoding_of(policy, decoding).items() if k != "max_new_tokens"}}
        record = {**dataclasses.asdict(config), **extra, "n_per_category": {c: sum(1 for e in entries if e.category == c) for c in config.categories},
                  "policy": policy_stats(policy)}
        name = f"bfcl_{arm}"
        out[name] = SuiteResult(name, rows, record, config_hash(name, config, [e.id for e in entries], extra), time.perf_counter() - start)
    return out
