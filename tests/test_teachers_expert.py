"""Expert teachers (issue 12): gold replay through the real τ² harness, rendered as the student's tokens."""
from __future__ import annotations

import pytest

from agenttune_lib.events import EventKind


@pytest.fixture(scope="module")
def student_tok():
    from agenttune_lib.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def test_tau2_gold_replay_reaches_gold_state_on_every_train_task(student_tok):
    from agenttune_lib.spine.collect import collect_teacher, expert_tau2_tasks
    from agenttune_lib.spine.tau2 import load_tau2_tasks
    from agenttune_lib.teachers import Tau2ExpertTeacher

    teacher = Tau2ExpertTeacher(student_tok)
    tasks = expert_tau2_tasks("train", include_non_demonstrations=True)
    assert len(tasks) == len(load_tau2_tasks("train")) == 74
    run = collect_teacher(teacher, tasks)
    assert not run.failures and len(run.logs) == 74
    for log, task in zip(run.logs, run.tasks):
        assert log.rewards("episode") == [1.0], task.task_id  # the harness's own DB match
        assert log.tier == "full"
        calls = [(e.payload["name"], e.payload["arguments"]) for e in log.filter(EventKind.TOOL_CALL)]
        assert calls == [(a["name"], a.get("arguments") or {}) for a in task.task.actions]
        final = log.filter(EventKind.TEXT)[-1].payload["content"]
        assert all(info in final for info in task.task.communicate_info)
        assert log.metadata["teacher_kind"] == "expert_tau2" and log.metadata["teacher_version"]
    non_demo = [t for t in tasks if not t.demonstration]
    assert non_demo and all(Tau2ExpertTeacher.is_demonstration(t.task) is False for t in non_demo)
    assert len(expert_tau2_tasks("train")) == 74 - len(non_demo)  # skipped by default
    summary = run.summary()
    assert summary["success_rate"] == 1.0 and summary["valid_call_rate"] == 1.0


def test_scripted_turns_are_the_students_own_token_rendering(student_tok):
    from agenttune_lib.spine.collect import collect_teacher, expert_tau2_tasks
    from agenttune_lib.teachers import Tau2ExpertTeacher

    tok = student_tok
    log = collect_teacher(Tau2ExpertTeacher(tok), expert_tau2_tasks("train", n_tasks=1)).logs[0]
    # The log's token sequence is exactly the chat template's rendering of the conversation the student saw.
    from agenttune_lib.spine.prompts import messages_from_events

    from agenttune_lib.spine.collect import TeacherConfig

    messages = messages_from_events(log.metadata["system_prompt"], log.events, TeacherConfig().max_tool_chars)
    rendered = tok.apply_chat_template(messages, tokenize=False)
    decoded = tok.decode(log.token_ids)
    assert rendered.startswith(decoded) and rendered[len(decoded):].strip() == ""
    spans = [e.token_span for e in log if e.kind in (EventKind.TOOL_CALL, EventKind.TEXT)]
    assert all(spans)
    for e in log:
        if e.kind is EventKind.TOOL_CALL:
            text = tok.decode(log.token_ids[e.token_span[0]:e.token_span[1]])
            assert text.startswith("<tool_call>{") and text.count("</tool_call>") == 1


def test_failing_task_is_logged_and_skipped_and_successes_are_kept(student_tok):
    from agenttune_lib.spine.collect import collect_teacher, expert_tau2_tasks
    from agenttune_lib.teachers import Tau2ExpertTeacher

    tasks = expert_tau2_tasks("train", n_tasks=3)
    teacher = Tau2ExpertTeacher(student_tok, tasks=[t.task for t in tasks[:1]] + [t.task for t in tasks[2:]])  # knows no task 2
    written = []
    run = collect_teacher(teacher, tasks, on_log=lambda log, task: written.append(task.task_id))
    assert [f["task_id"] for f in run.failures] == [tasks[1].task_id] and "no τ² task" in run.failures[0]["error"]
    assert written == [tasks[0].task_id, tasks[2].task_id] and len(run.logs) == 2


def test_rejection_sampling_keeps_only_rewarded_episodes(student_tok):
    from agenttune_lib.spine.collect import TeacherConfig, collect_teacher, expert_tau2_tasks

    tasks = expert_tau2_tasks("train", n_tasks=2)
    # a "model" that answers at once never changes the database: every attempt fails, no log is kept
    run = collect_teacher(lambda messages: "I cannot help.", tasks, TeacherConfig(rejection_attempts=2))
    assert not run.logs and len(run.failures) == 2 and "rejection sampling" in run.failures[0]["error"]


def test_teacher_kind_and_version_reach_the_trajectories_table_even_in_an_older_warehouse(student_tok, tmp_path):
    import duckdb

    from agenttune_lib.spine.collect import collect_teacher, expert_tau2_tasks
    from agenttune_lib.teachers import Tau2ExpertTeacher
    from agenttune_lib.warehouse import Provenance, Warehouse
    from agenttune_lib.warehouse.schema import TRAJECTORY_SCHEMA, ddl

    path = tmp_path / "old.duckdb"
    old_schema = TRAJECTORY_SCHEMA.remove(TRAJECTORY_SCHEMA.get_field_index("teacher_kind"))
    old_schema = old_schema.remove(old_schema.get_field_index("teacher_version"))
    with duckdb.connect(str(path)) as con:  # a warehouse written before the teacher columns existed
        con.execute(ddl("trajectories", old_schema))
    teacher = Tau2ExpertTeacher(student_tok)
    log = collect_teacher(teacher, expert_tau2_tasks("train", n_tasks=1)).logs[0]
    wh = Warehouse(path)
    wh.append_logs([log], provenance=Provenance(run_id="r", asset_key="teacher_trajectories"), source="teacher")
    assert wh.execute("SELECT teacher_kind, teacher_version FROM trajectories WHERE id = ?", [log.id]) == [("expert_tau2", teacher.info.version)]


def test_qa_expert_walks_the_gold_chain_with_real_searches_never_querying_the_answer(student_tok, tmp_path):
    from agenttune_lib.corpus import Document
    from agenttune_lib.rag import SearchCorpusTool
    from agenttune_lib.rag.backends import BM25Backend
    from agenttune_lib.rag.chunking import chunk_documents
    from agenttune_lib.spine.collect import collect_teacher, expert_qa_tasks
    from agenttune_lib.teachers import QAExpertTeacher

    docs = [
        Document.create("The Licensor grants a Beta Licence to the Evaluator for internal testing only.", "f", "a.txt"),
        Document.create("Beta Licence. Each Beta Licence terminates after the Trial Window of ninety days.", "f", "b.txt"),
        Document.create("Payment terms: invoices are due within thirty days of receipt.", "f", "c.txt"),
        Document.create("Governing law: this agreement is governed by the laws of Ontario.", "f", "d.txt"),
    ]
    chunks, _ = chunk_documents(docs)
    by_text = {c.text.split()[0 if c.text.startswith("Beta") else 1]: c.chunk_id for c in chunks}
    search = SearchCorpusTool(BM25Backend.build(chunks, tmp_path / "index"), k=1)
    start, answer_chunk = by_text["Licensor"], by_text["Beta"]
    row = {
        "qa_id": "q1", "question": "Under the evaluation grant, how long until the granted licence ends?", "answer": "ninety days",
        "gold_chunk_ids": [start, answer_chunk], "hops": 2,
        "chain": [{"hop": 1, "chunk_id": start, "bridge_in": "", "bridge_out": "Beta Licence", "clue": ["Licensor grants", "Evaluator"]},
                  {"hop": 2, "chunk_id": answer_chunk, "bridge_in": "Beta Licence", "bridge_out": "", "clue": ""}],
    }
    teacher = QAExpertTeacher(search, [row], student_tok)
    run = collect_teacher(teacher, expert_qa_tasks([row], teacher))
    log = run.logs[0]
    assert log.rewards("episode") == [1.0] and log.tier == "full"
    queries = [e.payload["arguments"]["query"] for e in log.filter(EventKind.TOOL_CALL)]
    assert len(queries) == 2 and all("ninety" not in q.lower() and "days" not in q.lower() for q in queries)
    assert [(e["chunk_id"], e["search"], e["rank"]) for e in log.metadata["evidence"]] == [(start, 0, 1), (answer_chunk, 1, 1)]
    assert log.filter(EventKind.TEXT)[-1].payload["content"] == "ninety days"


def _words_of(text):
    import re

    return {w.lower() for w in re.findall(r"[A-Za-z0-9]+", text)}


def test_qa_expert_queries_use_only_text_the_student_has_seen_and_read_a_cut_passage_whole(student_tok, tmp_path):
    """Default (query_source='context'): every query's words come from the question or from results shown before it,
    never from the unseen gold passage; a gold passage shown cut short before its answer is searched again alone (k=1)."""
    from agenttune_lib.corpus import Document
    from agenttune_lib.rag import SearchCorpusTool
    from agenttune_lib.rag.backends import BM25Backend
    from agenttune_lib.rag.chunking import chunk_documents
    from agenttune_lib.spine.collect import collect_teacher, expert_qa_tasks
    from agenttune_lib.teachers import QAExpertTeacher

    filler = " ".join(f"Clause {i} restates the obligations of the Supplier under the Framework." for i in range(8))
    docs = [
        Document.create("The Licensor grants a Beta Licence to the Evaluator for internal testing only.", "f", "a.txt"),
        Document.create(f"Beta Licence schedule. {filler} The Beta Licence window closes after ninety days in Zanzibar.", "f", "b.txt"),
        Document.create("Beta Licence fees are waived for charities registered in Quebec.", "f", "c.txt"),
        Document.create("Payment terms: invoices are due within thirty days of receipt.", "f", "d.txt"),
    ]
    chunks, _ = chunk_documents(docs)
    ids = {d: next(c.chunk_id for c in chunks if c.doc_id == doc.doc_id) for d, doc in zip("abcd", docs)}
    search = SearchCorpusTool(BM25Backend.build(chunks, tmp_path / "index"), k=3, max_chars=800)
    question = "In the clause mentioning “Licensor grants” and “Evaluator”, how long until the granted licence ends?"
    row = {"qa_id": "q1", "question": question, "answer": "ninety days",
           "gold_chunk_ids": [ids["a"], ids["b"]], "hops": 2,
           "chain": [{"hop": 1, "chunk_id": ids["a"], "bridge_in": "", "bridge_out": "Beta Licence", "clue": ["Licensor grants", "Evaluator"]},
                     {"hop": 2, "chunk_id": ids["b"], "bridge_in": "Beta Licence", "bridge_out": "", "clue": ""}]}
    for source in ("context", "passage"):
        teacher = QAExpertTeacher(search, [row], student_tok, query_source=source)
        log = collect_teacher(teacher, expert_qa_tasks([row], teacher)).logs[0]
        seen = _words_of(row["question"]) | _words_of("search_corpus")
        unseen = []
        for event in log:
            if event.kind is EventKind.TOOL_CALL:
                unseen += sorted(_words_of(event.payload["arguments"]["query"]) - seen)
            elif event.kind is EventKind.TOOL_RESULT:
                seen |= _words_of(event.payload["content"])
        if source == "passage":  # the gold passage's own rare words rank hop 2 first: not imitable
            assert unseen, "the gold passage mode should have used words the student never saw"
            continue
        assert unseen == [], unseen
        calls = [e.payload["arguments"] for e in log.filter(EventKind.TOOL_CALL)]
        assert calls[-1].get("k") == 1 and len(calls) == 3, calls  # hop 1, hop 2 (cut short), then the passage read whole
        assert log.metadata["answer_in_context"] is True and log.filter(EventKind.TEXT)[-1].payload["content"] == "ninety days"
    with pytest.raises(ValueError, match="query_source"):
        QAExpertTeacher(search, [row], student_tok, query_source="gold")
