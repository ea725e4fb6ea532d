"""Teacher evidence: gold-hop recall and answer-in-context of the QA expert on a materialized index (no model runs).

Usage: python bench/teacher_evidence.py SPLIT N TOOL_CHARS PROMPT_TOOL_CHARS WAREHOUSE ARTIFACTS [QUERY_SOURCE]
(e.g. train 48 1200 1500 .agenttune/warehouse.duckdb .agenttune/artifacts context after `agenttune materialize`).
"""
import sys, time
from pathlib import Path
from agenttune_lib.warehouse import Warehouse
from agenttune_lib.rag import SearchCorpusTool, load_backend
from agenttune_lib.rag.splits import load_qa_split
from agenttune_lib.rag.workflow import RagPaths
from agenttune_lib.spine.collect import collect_teacher, expert_qa_tasks, TeacherConfig
from agenttune_lib.teachers import QAExpertTeacher
split, n, tool_chars, mtc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
warehouse, artifacts = sys.argv[5], sys.argv[6]
t0 = time.time()
items = load_qa_split(Warehouse(warehouse), split)[:n]
search = SearchCorpusTool(load_backend(RagPaths.under(Path(artifacts)).index, "hybrid"), max_chars=tool_chars)
source = sys.argv[7] if len(sys.argv) > 7 else "context"
teacher = QAExpertTeacher(search, items, None, query_source=source)
config = TeacherConfig(max_tool_chars=mtc)  # the prompt's clip: both the tasks and the episodes' strategy take it
run = collect_teacher(teacher, expert_qa_tasks(items, teacher, config), config)
ev = [e for log in run.logs for e in log.metadata.get("evidence") or []]
aic = sum(bool(log.metadata.get("answer_in_context")) for log in run.logs)
ans_hop = sum(1 for log in run.logs if (log.metadata.get("evidence") or [{}])[-1].get("search") is not None)
ranks = [e["rank"] for e in ev if e["rank"]]
print(f"{source}: {split} n={len(run.logs)} tool_chars={tool_chars} mtc={mtc}: hop recall {sum(e['search'] is not None for e in ev)}/{len(ev)}, "
      f"answer hop found {ans_hop}/{len(run.logs)}, answer in context {aic}/{len(run.logs)}, rank>1: {sum(r>1 for r in ranks)}  ({time.time()-t0:.0f}s)")
texts, _ = teacher._passages
bad = 0
for log, it in zip(run.logs, items):
    ev = log.metadata.get("evidence") or []
    if ev and ev[-1].get("search") is not None and not log.metadata.get("answer_in_context"):
        ans = it["answer"]; t = texts.get(ev[-1]["chunk_id"], "")
        from agenttune_lib.teachers.qa import _norm
        pos = _norm(t).find(_norm(ans))
        print("MISS", repr(ans), "in chunk:", pos, "/", len(_norm(t)), "rank", ev[-1]["rank"], "other gold:", [_norm(texts.get(g, "")).find(_norm(ans)) for g in it["gold_chunk_ids"]])
        bad += 1
        if bad > 12: break
