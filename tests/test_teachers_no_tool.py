"""No-tool demonstrations: prompts whose offered tools do not fit (or that need none), answered without a call."""
from __future__ import annotations

import collections

import pytest

from agenttune_lib.teachers.no_tool import NoToolTeacher, no_tool_items


class _Tool:
    def __init__(self, name: str) -> None:
        self.name = name


_CHUNKS = [{"title": f"Agreement {i}", "text": f"The licensee shall keep every copy of the work number {i} confidential. Rest."}
           for i in range(6)]
_RETAIL = [_Tool(n) for n in ("get_order_details", "cancel_pending_order", "find_user_id_by_email", "list_all_product_types")]
_FILES = [_Tool(n) for n in ("read_file", "list_files", "grep")]
_SEARCH = _Tool("search_corpus")
_QUESTIONS = [f"Which party of agreement {i} must keep the work confidential?" for i in range(10)]


def test_unfit_qa_items_offer_a_real_question_only_tools_that_cannot_answer_it():
    items = no_tool_items(_CHUNKS, _RETAIL, _SEARCH, 27, questions=_QUESTIONS, file_tools=_FILES)
    kinds = collections.Counter(it["kind"] for it in items)
    assert kinds["unfit_qa"] == 10  # 11 slots in 27, capped by the 10 questions; the rest fall back to unfit_retail
    unfit_qa = [it for it in items if it["kind"] == "unfit_qa"]
    assert sorted(it["prompt"] for it in unfit_qa) == sorted(_QUESTIONS)  # every question once
    for it in unfit_qa:
        names = [t.name for t in it["tools"]]
        assert _SEARCH.name not in names and names
        assert all(n in it["answer"] for n in names) and "<tool_call>" not in it["answer"]
    assert any(set(t.name for t in it["tools"]) <= {t.name for t in _FILES} for it in unfit_qa)
    assert any(set(t.name for t in it["tools"]) <= {t.name for t in _RETAIL} for it in unfit_qa)
    assert len({it["prompt"] for it in items}) == len(items) < 27  # one reply per prompt: 6 passages repeat phrases


def test_without_questions_no_unfit_qa_item_is_built():
    items = no_tool_items(_CHUNKS, _RETAIL, _SEARCH, 12)
    kinds = {it["kind"] for it in items}
    assert "unfit_qa" not in kinds and {"unfit_retail", "unfit_search", "repeat", "upper", "count_words"} <= kinds


def test_no_tool_teacher_answers_each_prompt_with_its_items_reply():
    items = no_tool_items(_CHUNKS, _RETAIL, _SEARCH, 18, questions=_QUESTIONS, file_tools=_FILES)
    teacher = NoToolTeacher(items)
    for it in items:
        messages = [{"role": "system", "content": "tools: ..."}, {"role": "user", "content": it["prompt"]}]
        assert teacher(messages) == it["answer"]
    with pytest.raises(LookupError, match="no item has this prompt"):
        teacher([{"role": "user", "content": "an unrelated prompt"}])


def test_no_passage_phrase_is_a_clear_error():
    with pytest.raises(ValueError, match="none of the 1 passages has a sentence"):
        no_tool_items([{"title": "t", "text": "short."}], _RETAIL, _SEARCH, 4)


def test_near_miss_items_offer_only_sibling_retail_tools_that_cannot_serve_the_request():
    from agenttune_lib.spine.tau2 import Tau2RetailHarness, Tau2RetailTool, fresh_db, tau2_tool_schemas
    from agenttune_lib.teachers.near_miss import NEAR_MISS_NEEDS

    db, harness = fresh_db(), Tau2RetailHarness()
    retail = [Tau2RetailTool(schema, harness) for schema in tau2_tool_schemas()]
    items = no_tool_items(_CHUNKS, retail, _SEARCH, 60, questions=_QUESTIONS, file_tools=_FILES, retail_db=db)
    near = [it for it in items if it["kind"] == "unfit_near"]
    assert len(near) >= len(NEAR_MISS_NEEDS)  # every retail request at least once
    for it in near:
        names = [t.name for t in it["tools"]]
        assert 1 <= len(names) <= 2 and "transfer_to_human_agents" not in names
        assert all(n in it["answer"] for n in names) and "<tool_call>" not in it["answer"]
        need = next((n for n in NEAR_MISS_NEEDS if n.asks in it["answer"]), None)
        assert need is not None and need.tool not in names and not set(need.also) & set(names), it
    order_ids = [w.rstrip("?.;") for it in near for w in it["prompt"].split() if w.startswith("#W")]
    assert order_ids and all(o in db["orders"] for o in order_ids)  # requests name real orders of the τ² database
    assert "unfit_near" not in {it["kind"] for it in no_tool_items(_CHUNKS, retail, _SEARCH, 30, questions=_QUESTIONS)}


def test_collected_no_tool_logs_record_their_kind_for_distillation():
    from agenttune_lib.rl.train import no_tool_kind
    from agenttune_lib.spine.collect import collect_teacher, expert_no_tool_tasks
    from agenttune_lib.spine.tau2 import Tau2RetailHarness, Tau2RetailTool, fresh_db, tau2_tool_schemas

    harness = Tau2RetailHarness()
    retail = [Tau2RetailTool(schema, harness) for schema in tau2_tool_schemas()]
    items = no_tool_items(_CHUNKS, retail, retail[0], 13, retail_db=fresh_db())
    run = collect_teacher(NoToolTeacher(items), expert_no_tool_tasks(items), model_name="expert_no_tool:unfit-or-unneeded/1")
    assert not run.failures
    assert [log.metadata["no_tool_kind"] for log in run.logs] == [it["kind"] for it in items]
    assert [no_tool_kind(log) for log in run.logs] == [it["kind"] for it in items]
    assert {"unfit_near", "unfit_retail", "upper"} <= {it["kind"] for it in items}
