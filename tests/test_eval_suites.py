"""Suites: QA with the search tool, τ² with flagged no-op tasks and a do-nothing baseline, BFCL strict/platform per category;
a better-by-construction policy is told apart from the base model by the paired interval, and identical models are not."""
import dataclasses
import json

import pytest

from agenttune_lib.evaluation.batched import BatchedChatPolicy
from agenttune_lib.evaluation.bfcl.checker import ground_truth_calls
from agenttune_lib.evaluation.bfcl.data import load_bfcl
from agenttune_lib.evaluation.bfcl.decode import render_python_calls
from agenttune_lib.evaluation.store import compare_items
from agenttune_lib.evaluation.suites import BFCLSuiteConfig, QASuiteConfig, Tau2SuiteConfig, run_bfcl_suite, run_qa_suite, run_tau2_suite
from agenttune_lib.evaluation.suites.tau2 import action_recall, communicate_info_score, is_noop_task, select_tau2_tasks
from agenttune_lib.events import render_tool_call

spine_tau2 = pytest.importorskip("agenttune_lib.spine.tau2")


def _expert(tasks):
    """The issue-12 expert teacher when it is there, else the same gold replay scripted here."""
    try:
        from agenttune_lib.teachers.tau2 import Tau2ExpertTeacher

        return Tau2ExpertTeacher(tasks=tasks)
    except ImportError:
        by_prompt = {t.prompt: t for t in tasks}

        def policy(messages):
            user = next(m["content"] for m in messages if m["role"] == "user")
            task = next(t for p, t in by_prompt.items() if p in user)
            done = sum(1 for m in messages if m["role"] == "assistant")
            if done >= len(task.actions):
                return "Done: " + ", ".join(task.communicate_info)
            a = task.actions[done]
            return render_tool_call({"name": a["name"], "arguments": a.get("arguments") or {}})

        return policy


@pytest.fixture(scope="module")
def tiny_policy(tiny_model):
    model, tokenizer = tiny_model
    return BatchedChatPolicy(model, tokenizer, max_new_tokens=24, batch_size=8)


def _no_crash(result):
    crashed = [r for r in result.rows if r["error_type"].startswith("crash")]
    assert not crashed, crashed[0]
    return result


def test_tau2_expert_beats_the_base_model_and_identical_models_tie(tiny_policy):
    tasks = select_tau2_tasks("test", n=6, max_actions=3)
    noop = next(t for t in spine_tau2.load_tau2_tasks("test") if is_noop_task(t))
    tasks = tasks + [noop]
    cfg, dec = Tau2SuiteConfig(), {"max_new_tokens": 24, "temperature": 0.0, "seed": 0}
    expert = _no_crash(run_tau2_suite(_expert(tasks), tasks, cfg, decoding=dec))
    base = _no_crash(run_tau2_suite(tiny_policy, tasks, cfg))
    again = _no_crash(run_tau2_suite(tiny_policy, tasks, cfg))
    assert expert.config_hash == base.config_hash == again.config_hash
    assert expert.mean("success") == 1.0 and expert.mean("action_recall") == 1.0 and expert.n == 6
    flagged = [r for r in expert.rows if r["excluded"]]
    assert [r["item_id"] for r in flagged] == [noop.id] and flagged[0]["metrics"]["flagged_noop"]
    # the do-nothing baseline is scored beside the run: it "succeeds" only on the flagged task
    assert {r["item_id"]: r["success"] for r in expert.baseline_rows if r["success"]} == {noop.id: True}
    # step limits leave room for every gold action plus the answer
    assert all(expert.config["steps"][t.id] >= len(t.actions) + 2 for t in tasks)
    up = next(c for c in compare_items(_stamp(base), _stamp(expert), metrics=("success",)) if c.metric == "success")
    assert up.n == 6 and up.diff > 0 and up.ci_low > 0
    tie = compare_items(_stamp(base), _stamp(again), metrics=("success", "action_recall"))
    assert all(c.ci_low <= 0 <= c.ci_high for c in tie)
    # lockstep batching: the first turn serves every task in one call
    assert base.batch_sizes[0] == len(tasks)


def _stamp(result):
    return [{**r, "config_hash": result.config_hash} for r in result.rows]


def test_tau2_step_limit_that_fixes_scores_is_refused():
    task = select_tau2_tasks("test", max_actions=10)[-1]
    with pytest.raises(ValueError, match="fixed by construction"):
        run_tau2_suite(lambda m: "x", [task], Tau2SuiteConfig(max_steps=2))


def test_action_recall_and_communicate_info_are_deterministic():
    gold = [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]
    assert action_recall(gold, [{"name": "a", "arguments": '{"x": 1}'}]) == 0.5  # JSON-string arguments accepted
    assert action_recall(gold, [{"name": "a", "arguments": {"x": 2}}]) == 0.0
    assert action_recall([], []) is None
    assert communicate_info_score(["1,093.34"], "your refund is 1093.34 dollars") == 1.0
    assert communicate_info_score(["10"], "nothing") == 0.0


def _qa_index(tmp_path):
    from agenttune_lib.rag import SearchCorpusTool, load_backend
    from agenttune_lib.rag.backends import build_index
    from agenttune_lib.rag.chunking import Chunk

    facts = [("zebra", "The zebra lives in Kenya and eats grass."), ("violin", "The violin was made in Cremona by Stradivari."),
             ("comet", "The comet returns every 76 years according to Halley."), ("glacier", "The glacier melts in Patagonia during summer.")]
    chunks = [Chunk(f"c{i}", f"d{i}", 0, text, title=name) for i, (name, text) in enumerate(facts)]
    chunks += [Chunk(f"f{i}", f"filler{i}", 0, f"Filler passage number {i} about nothing in particular.") for i in range(6)]
    build_index(chunks, tmp_path / "idx", kinds=("bm25",))
    tool = SearchCorpusTool(load_backend(tmp_path / "idx", "bm25"), k=3)
    items = [{"qa_id": "q0", "question": "Where does the zebra live?", "answer": "Kenya", "gold_chunk_ids": ["c0"], "hops": 1},
             {"qa_id": "q1", "question": "Where was the violin made?", "answer": "Cremona", "gold_chunk_ids": ["c1"], "hops": 1},
             {"qa_id": "q2", "question": "How often does the comet return?", "answer": "76 years", "gold_chunk_ids": ["c2"], "hops": 1},
             {"qa_id": "q3", "question": "Where does the glacier melt?", "answer": "Patagonia", "gold_chunk_ids": ["c3"], "hops": 1}]
    return tool, items


def _qa_oracle(items):
    """Searches the question's key word once, then answers with the gold answer."""
    def policy(messages):
        user = next(m["content"] for m in messages if m["role"] == "user")
        item = next(i for i in items if i["question"] in user)
        if not any(m["role"] == "tool" for m in messages):
            return render_tool_call({"name": "search_corpus", "arguments": {"query": item["question"].split()[-2]}})
        return f"The answer is {item['answer']}."
    return policy


def test_qa_suite_scores_answers_searches_and_doc_at_8(tmp_path, tiny_policy):
    tool, items = _qa_index(tmp_path)
    oracle = _no_crash(run_qa_suite(_qa_oracle(items), items, tool, QASuiteConfig(max_steps=3)))
    assert [r["success"] for r in oracle.rows] == [True] * 4
    m = oracle.rows[0]["metrics"]
    assert m["containment"] == 1.0 and m["exact_match"] == 0.0 and m["searches"] == 1.0 and m["doc_at_8"] == 1.0
    assert m["valid_call"] == 1.0 and m["valid_calls"] == 1
    base = _no_crash(run_qa_suite(tiny_policy, items, tool, QASuiteConfig(max_steps=3)))
    assert base.config_hash != oracle.config_hash  # the tiny policy's decoding settings are part of the config
    assert base.config["decoding"] == {"max_new_tokens": 24, "temperature": 0.0, "seed": 0}
    assert base.mean("containment") == 0.0 and base.batch_sizes[0] == 4
    assert base.mean("valid_call") == 0.0  # the random tiny model never makes a call the tool accepts


def _chain_walker(items):
    """Searches once per gold hop (as the expert teacher walks a chain), then answers with the gold answer."""
    def policy(messages):
        user = next(m["content"] for m in messages if m["role"] == "user")
        item = next(i for i in items if i["question"] in user)
        if sum(m["role"] == "tool" for m in messages) < item["hops"]:
            return render_tool_call({"name": "search_corpus", "arguments": {"query": item["question"].split()[-2]}})
        return f"The answer is {item['answer']}."
    return policy


def test_hop_steps_give_a_chain_walker_the_steps_to_answer(tmp_path):
    tool, items = _qa_index(tmp_path)
    items = [{**it, "hops": h} for it, h in zip(items, (1, 2, 3, 5))]
    cfg = QASuiteConfig(max_steps=4, hop_steps=True)
    # hops + 1 always (a 5-hop item gets 6 steps although max_steps is 4); max_steps caps only the unknown
    assert [cfg.steps_for(it) for it in items] == [2, 3, 4, 6] and cfg.steps_for({"hops": None}) == 4
    assert QASuiteConfig(max_steps=4).steps_for(items[0]) == 4  # off: every item gets max_steps
    with pytest.raises(ValueError, match="step_slack"):
        QASuiteConfig(hop_steps=True, step_slack=-1)
    # A fixed 2-step budget cuts off every multi-hop walk before its answer; one search per hop + the answer does not.
    fixed = _no_crash(run_qa_suite(_chain_walker(items), items, tool, QASuiteConfig(max_steps=2)))
    hop = _no_crash(run_qa_suite(_chain_walker(items), items, tool, cfg))
    assert [r["success"] for r in fixed.rows] == [True, False, False, False]
    assert [r["success"] for r in hop.rows] == [True, True, True, True]  # every walk gets its hops + 1 steps
    assert [(r["metrics"]["step_budget"], r["metrics"]["hops"]) for r in hop.rows] == [(2, 1), (3, 2), (4, 3), (6, 5)]
    assert hop.config_hash != fixed.config_hash


def test_final_answer_turn_asks_for_the_answer_before_the_last_step_only(tmp_path):
    """An agent that keeps searching answers nothing within its budget; asked before its last step, it answers from
    what it found. The request is added to the last step's prompt alone, never to an earlier one."""
    from agenttune_lib.evaluation.suites.qa import FINAL_ANSWER_PROMPT

    tool, items = _qa_index(tmp_path)
    seen: list[tuple[int, bool]] = []

    def keeps_searching(messages):
        user = next(m["content"] for m in messages if m["role"] == "user")
        item = next(i for i in items if i["question"] in user)
        asked = messages[-1]["role"] == "user" and messages[-1]["content"] == FINAL_ANSWER_PROMPT
        seen.append((sum(m["role"] == "tool" for m in messages), asked))
        if asked:
            return f"The answer is {item['answer']}."
        return render_tool_call({"name": "search_corpus", "arguments": {"query": item["question"].split()[-2]}})

    cfg = QASuiteConfig(max_steps=3)
    off = _no_crash(run_qa_suite(keeps_searching, items, tool, cfg))
    assert [r["success"] for r in off.rows] == [False] * 4 and not any(asked for _, asked in seen)
    seen.clear()
    on = _no_crash(run_qa_suite(keeps_searching, items, tool, dataclasses.replace(cfg, final_answer_turn=True)))
    assert [r["success"] for r in on.rows] == [True] * 4
    assert sorted(seen) == sorted([(0, False), (1, False), (2, True)] * 4)  # asked at the third (last) step only
    assert on.config_hash != off.config_hash and on.rows[0]["metrics"]["searches"] == 2.0


def _gt_policy(entries, arm):
    by_q = {json.dumps(e.messages): e for e in entries}

    def policy(messages):
        e = next(e for q, e in by_q.items() if json.loads(q)[-1]["content"] == messages[-1]["content"])
        if e.ground_truth is None:
            return "None of the functions fit."
        calls = ground_truth_calls(e)
        if arm == "strict":
            return render_python_calls(calls)
        return "\n".join(render_tool_call({"name": n, "arguments": a}) for c in calls for n, a in c.items())
    return policy


def test_bfcl_strict_and_platform_per_category_with_no_overall():
    cfg = BFCLSuiteConfig(categories=("simple_python", "parallel", "irrelevance"), limit=4, sample_seed=0)
    entries = [e for c in cfg.categories for e in load_bfcl(c, limit=4, sample_seed=0)]
    for arm in ("strict", "platform"):
        res = run_bfcl_suite(_gt_policy(entries, arm), BFCLSuiteConfig(**{**cfg.__dict__, "arms": (arm,)}))[f"bfcl_{arm}"]
        assert res.mean("score") == 1.0, [r for r in res.rows if not r["success"]]
    silent = run_bfcl_suite(lambda m: "I will not call anything.", cfg)
    for arm in ("bfcl_strict", "bfcl_platform"):
        res = silent[arm]
        assert res.mean("score", "irrelevance") == 1.0 and res.mean("score", "simple_python") == 0.0 and res.mean("score", "parallel") == 0.0
        assert "overall" not in res.categories()
        budgets = res.config["max_new_tokens_by_category"]
        assert budgets["irrelevance"] == 128 and 64 <= budgets["simple_python"] < budgets["parallel"], budgets
    # strict is BFCL's own decoding: a <tool_call> reply is not a Python call list
    cross = run_bfcl_suite(_gt_policy(entries, "platform"), BFCLSuiteConfig(**{**cfg.__dict__, "arms": ("strict",)}))["bfcl_strict"]
    assert cross.mean("score", "simple_python") == 0.0
    with pytest.raises(ValueError, match="max_new_tokens=48 must be an integer of at least 64"):
        BFCLSuiteConfig(max_new_tokens=48)
    with pytest.raises(ValueError, match="no_call_new_tokens"):
        BFCLSuiteConfig(no_call_new_tokens=10)


class _BudgetedBatchPolicy:
    """A batched policy that answers each item's ground truth but keeps only about 2 characters per allowed new token."""

    tokenizer = None

    def __init__(self, entries, arm):
        self.answer, self.max_new_tokens, self.stop_strings, self.calls = _gt_policy(entries, arm), 0, ("x",), []

    def generate_batch(self, convs, tools=None):
        self.calls.append((len(convs), self.max_new_tokens, self.stop_strings))
        return [self.answer(c)[: 2 * self.max_new_tokens] for c in convs]


@pytest.mark.parametrize("arm", ["strict", "platform"])
def test_bfcl_each_category_decodes_in_its_own_batch_with_a_budget_its_longest_answer_fits(arm):
    cfg = BFCLSuiteConfig(categories=("simple_python", "parallel", "irrelevance"), limit=4, sample_seed=0, arms=(arm,))
    entries = [e for c in cfg.categories for e in load_bfcl(c, limit=4, sample_seed=0)]
    policy = _BudgetedBatchPolicy(entries, arm)
    res = run_bfcl_suite(policy, cfg)[f"bfcl_{arm}"]
    budgets = res.config["max_new_tokens_by_category"]
    assert [c[1] for c in policy.calls] == [budgets[c] for c in cfg.categories] and all(c[0] == 4 and c[2] == () for c in policy.calls)
    assert res.mean("score") == 1.0, [r for r in res.rows if not r["success"]]
    assert policy.max_new_tokens == 0 and policy.stop_strings == ("x",)  # the policy's own settings come back
    fixed = run_bfcl_suite(_BudgetedBatchPolicy(entries, arm), BFCLSuiteConfig(**{**cfg.__dict__, "max_new_tokens": 300}))[f"bfcl_{arm}"]
    assert set(fixed.config["max_new_tokens_by_category"].values()) == {300}


def test_bfcl_dict_typed_parameters_convert_and_validate():
    from agenttune_lib.evaluation.suites.bfcl import platform_tools
    from agenttune_lib.evaluation.trajectory import tool_argument_correctness

    fn = {"name": "f", "description": "", "parameters": {"type": "dict", "properties": {"o": {"type": "dict", "properties": {"v": {"type": "float"}}},
                                                                                        "t": {"type": "tuple", "items": {"type": "integer"}}}, "required": ["o"]}}
    params = platform_tools([fn])[0]["function"]["parameters"]
    assert params["type"] == "object" and params["properties"]["o"]["properties"]["v"]["type"] == "number"
    schemas = {"f": fn["parameters"]}  # BFCL schema given as a mapping, dict types and all
    assert tool_argument_correctness({"tool_calls": [{"name": "f", "arguments": '{"o": {"v": 1.5}, "t": [1]}'}]}, schemas) == 1.0
    assert tool_argument_correctness({"tool_calls": [{"name": "f", "arguments": {"o": "x"}}]}, schemas) == 0.0


def test_tau2_token_budget_fits_the_longest_gold_call(tiny_policy):
    from agenttune_lib.evaluation.suites.tau2 import _token_budget

    tasks = select_tau2_tasks("test", n=3, max_actions=1)
    longest = max(len(tiny_policy.tokenizer(render_tool_call({"name": a["name"], "arguments": a["arguments"]}))["input_ids"])
                  for t in tasks for a in t.actions)
    assert _token_budget(tiny_policy, tasks) >= longest > tiny_policy.max_new_tokens
    assert _token_budget(lambda m: "x", tasks) is None
