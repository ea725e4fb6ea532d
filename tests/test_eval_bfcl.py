"""BFCL calibration: ground truth scores 100%, perturbations drop as BFCL's own checker says."""
import copy
import random

import pytest

from _eval_helpers import load_bfcl_reference_checker, reference_verdict
from agenttune_lib.evaluation.bfcl import (
    AST_CATEGORIES, BFCLDecodeError, check_ast, check_entry_output, decode_calls, ground_truth_calls, load_bfcl,
    render_python_calls, run_bfcl, score_outputs,
)
from agenttune_lib.evaluation.bfcl.data import KNOWN_INCONSISTENT_GROUND_TRUTH
from agenttune_lib.evaluation.settings import EvalSettings
from agenttune_lib.events import render_tool_call


def as_tool_call_text(calls):
    return "".join(render_tool_call({"name": n, "arguments": a}) for c in calls for n, a in c.items())


def test_category_sizes_match_the_published_benchmark():
    sizes = {c: len(load_bfcl(c)) for c in ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")}
    assert sizes == {"simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200, "irrelevance": 240}


@pytest.mark.parametrize("category", AST_CATEGORIES)
def test_ground_truth_scores_100_percent(category):
    entries = load_bfcl(category)
    failed_py, failed_tag = set(), set()
    for e in entries:
        calls = ground_truth_calls(e)
        if not check_entry_output(e, render_python_calls(calls)).valid:
            failed_py.add(e.id)
        if not check_entry_output(e, as_tool_call_text(calls)).valid:
            failed_tag.add(e.id)
    expected = {e.id for e in entries} & KNOWN_INCONSISTENT_GROUND_TRUTH
    assert failed_py == expected and failed_tag == expected
    if not category.startswith("live"):
        assert not failed_py  # the non-live categories are fully consistent: exactly 100%


def test_known_inconsistent_entries_fail_under_bfcls_own_checker_too():
    ref = load_bfcl_reference_checker()
    if ref is None:
        pytest.skip("bfcl-eval not installed")
    for cat in ("live_simple", "live_multiple"):
        for e in load_bfcl(cat):
            if e.id in KNOWN_INCONSISTENT_GROUND_TRUTH:
                assert reference_verdict(ref, e, ground_truth_calls(e)) is False


def test_irrelevance_no_call_is_correct():
    entries = load_bfcl("irrelevance", limit=20)
    refusals = score_outputs(entries, ["None of the functions can be used for this question."] * 20)
    assert all(r["valid"] for r in refusals)
    calls = score_outputs(entries, [f"[{e.functions[0]['name']}(x=1)]" for e in entries])
    assert not any(r["valid"] for r in calls)
    assert all(r["valid"] for r in score_outputs(entries, ["[]"] * 20))


def _perturbations(entry, calls, other_calls):
    """(label, decoded calls) variants of a ground-truth output."""
    out = [("ground_truth", calls), ("shuffled", other_calls)]
    first_name, first_args = next(iter(calls[0].items()))
    if first_args:
        param, value = next(iter(first_args.items()))
        if isinstance(value, bool):
            new = not value
        elif isinstance(value, int):
            new = value + 7
        elif isinstance(value, float):
            new = value * 2 + 1.5
        elif isinstance(value, str):
            new = value + " zz"
        elif isinstance(value, list):
            new = value + value[:1] if value else ["zz"]
        elif isinstance(value, dict):
            new = {**value, "zz_extra": 1}
        else:
            new = None
        v = copy.deepcopy(calls)
        v[0][first_name][param] = new
        out.append(("value", v))
        v = copy.deepcopy(calls)
        v[0][first_name][param] = str(value) if not isinstance(value, str) else 12345
        out.append(("type", v))
        v = copy.deepcopy(calls)
        del v[0][first_name][param]
        out.append(("dropped_param", v))
    v = copy.deepcopy(calls)
    v[0][first_name]["zz_unexpected"] = 1
    out.append(("extra_param", v))
    v = copy.deepcopy(calls)
    v[0] = {first_name + "_x": v[0][first_name]}
    out.append(("wrong_name", v))
    if len(calls) > 1:
        out.append(("reordered", list(reversed(calls))))
        out.append(("missing_call", calls[:-1]))
    else:
        out.append(("duplicated_call", calls + calls))
    out.append(("no_call", []))
    return out


def test_agrees_with_bfcls_own_checker_on_a_perturbed_sample():
    ref = load_bfcl_reference_checker()
    if ref is None:
        pytest.skip("bfcl-eval not installed")
    rng = random.Random(0)
    by_label: dict[str, list[bool]] = {}
    n = 0
    for cat in AST_CATEGORIES:
        entries = load_bfcl(cat)
        sample = rng.sample(entries, min(40, len(entries)))
        for e in sample:
            other = rng.choice([x for x in entries if x.id != e.id])
            for label, decoded in _perturbations(e, ground_truth_calls(e), ground_truth_calls(other)):
                ours = check_ast(e.functions, decoded, e.ground_truth, e.category).valid
                theirs = reference_verdict(ref, e, decoded)
                assert ours == theirs, (e.id, label, decoded)
                by_label.setdefault(label, []).append(ours)
                n += 1
    assert n > 1500
    acc = {k: sum(v) / len(v) for k, v in by_label.items()}
    assert acc["ground_truth"] > 0.98
    for label in ("shuffled", "value", "dropped_param", "extra_param", "wrong_name", "missing_call", "no_call", "duplicated_call"):
        assert acc[label] < 0.35, (label, acc[label])
    assert acc["reordered"] > 0.95  # parallel calls are order-free


def test_decoder_formats():
    assert decode_calls("[f(a=1, b='x'), g.h(c=[1, 2], d={'k': -2.5})]") == [{"f": {"a": 1, "b": "x"}}, {"g.h": {"c": [1, 2], "d": {"k": -2.5}}}]
    assert decode_calls("f(a=2**3)") == [{"f": {"a": 8}}]
    assert decode_calls("```python\n[f(a=True)]\n```") == [{"f": {"a": True}}]
    assert decode_calls('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>') == [{"f": {"a": 1}}]
    assert decode_calls('[{"name": "f", "parameters": {"a": 1}}]') == [{"f": {"a": 1}}]
    assert decode_calls("[]") == []
    assert decode_calls("f(a=__import__('os'))") == [{"f": {"a": "__import__('os')"}}]  # parsed, never evaluated
    for bad in ("I cannot help with that.", "<tool_call>{not json}</tool_call>", "[1, 2]", "f(a=lambda: 1)"):
        with pytest.raises(BFCLDecodeError):
            decode_calls(bad)


def test_run_bfcl_records_seeds_and_conditions():
    entries = {e.id: e for e in load_bfcl("simple_python", limit=4)}
    right = set(list(entries)[:2])

    def generate(messages, seed, temperature, max_new_tokens):  # test-only fake model
        assert messages[0]["role"] == "system" and "func_name1" in messages[0]["content"]
        question = messages[-1]["content"]
        entry = next((e for e in entries.values() if e.messages[-1]["content"] == question), None)
        if entry is None:
            return "None of the functions apply."
        if entry.id in right or seed == 1:
            return render_python_calls(ground_truth_calls(entry))
        return "I don't know."

    res = run_bfcl(generate, ["simple_python", "irrelevance"], limit=4, settings=EvalSettings(seeds=(0, 1, 2)))
    sp = res.categories["simple_python"]
    assert sp["per_seed"] == {"0": 0.5, "1": 1.0, "2": 0.5}
    assert sp["mean"] == pytest.approx(2 / 3) and sp["std"] == pytest.approx(0.288675, abs=1e-5)
    assert res.categories["irrelevance"]["mean"] == 1.0
    assert res.settings["template_mode"] == "native" and res.settings["keep_thinking_history"] is True
    assert len(res.settings["system_prompt_sha256"]) == 16 and res.settings["seeds"] == [0, 1, 2]
    assert len(res.items) == 3 * 8


def test_context_template_puts_everything_in_one_user_turn():
    seen = []

    def generate(messages, **kw):
        seen.append(messages)
        return "[]"

    run_bfcl(generate, ["simple_python"], limit=1, settings=EvalSettings(seeds=(0,), template_mode="context"))
    assert len(seen[0]) == 1 and seen[0][0]["role"] == "user" and "func_name1" in seen[0][0]["content"]


def test_unknown_category_is_named():
    with pytest.raises(ValueError, match="multi_turn_base"):
        load_bfcl("multi_turn_base")
