"""The answer step alone: what a student writes when the expert's searches put the evidence in its context.

The held-out QA suite scores a whole episode: the student's own searches, then its answer. This bench hands the
searches to the QA expert (``QAExpertTeacher``: real ``search_corpus`` calls planned from the item's gold chain) and
lets the student write only the final turn, greedily, so containment here is an upper bound on what better searching
alone could give that student. Base vs adapter, paired, on the first ``--items`` QA validation items, with the suite's
settings (``evaluation_report`` defaults).

    python bench/answer_ceiling.py --home <AGENTTUNE_HOME> --adapter <adapter dir> --items 46 --out runs/ceiling

``--ask`` adds the suite's last-step request (``FINAL_ANSWER_PROMPT``) as a user turn before each student turn. Prints
the paired comparison rows and, per arm, how many student turns were a tool call, text or empty, and the first texts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class ExpertSearchesStudentAnswers:
    """A QA policy: the expert's turn where the expert would search, the student's greedy turn where it would answer."""

    def __init__(self, expert: Any, student: Any, ask: bool = False) -> None:
        self.expert, self.student, self.ask = expert, student, ask
        self.answers: list[str] = []

    def _expert_turn(self, messages: Sequence[dict[str, Any]]) -> Any | None:
        from agenttune_lib.teachers.base import scripted_generation
        from agenttune_lib.teachers.qa import NOT_FOUND

        text = self.expert.next_text(messages)
        answer = str(self.expert.items[self.expert.item_for(messages)]["answer"])
        if text in (answer, NOT_FOUND):
            return None  # the expert would answer here: the student writes this turn
        return scripted_generation(self.expert.tokenizer, messages, text)

    def generate_batch(self, conversations: Sequence[Any], tools: Sequence[dict[str, Any]] | None = None) -> list[Any]:
        turns = [self._expert_turn(c) for c in conversations]
        todo = [i for i, t in enumerate(turns) if t is None]
        if todo:
            from agenttune_lib.evaluation.suites.qa import FINAL_ANSWER_PROMPT

            ask = [{"role": "user", "content": FINAL_ANSWER_PROMPT}] if self.ask else []
            for i, gen in zip(todo, self.student.generate_batch([[*conversations[i], *ask] for i in todo], tools)):
                turns[i] = gen
                self.answers.append(str(getattr(gen, "text", gen)))
        return turns

    def __call__(self, messages: Any) -> Any:
        return self.generate_batch([messages])[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, required=True, help="an AGENTTUNE_HOME that has materialized qa_splits and retrieval_index")
    ap.add_argument("--adapter", type=Path, required=True, help="the adapter directory (adapter_config.json)")
    ap.add_argument("--items", type=int, default=46)
    ap.add_argument("--out", type=Path, default=Path("runs/answer_ceiling"))
    ap.add_argument("--ask", action="store_true", help="ask for the answer in a user turn (the suite's FINAL_ANSWER_PROMPT) before the student's turn")
    args = ap.parse_args()
    if not (args.adapter / "adapter_config.json").exists():
        sys.exit(f"--adapter {args.adapter}: no adapter_config.json there")

    from agenttune_assets.defs.assets.evaluate import EvaluationReportConfig
    from agenttune_lib.evaluation.batched import load_policy
    from agenttune_lib.evaluation.compare import ModelSpec, run_comparison
    from agenttune_lib.models.base import ensure_base_model
    from agenttune_lib.rag import SearchCorpusTool, load_backend
    from agenttune_lib.rag.splits import load_qa_split
    from agenttune_lib.rag.workflow import RagPaths
    from agenttune_lib.teachers.qa import QAExpertTeacher
    from agenttune_lib.warehouse import Warehouse

    home = args.home
    info = ensure_base_model(home / "models")
    items = load_qa_split(Warehouse(home / "warehouse.duckdb"), "validation")
    search = SearchCorpusTool(load_backend(RagPaths.under(home / "artifacts").index, "hybrid"))
    lib = EvaluationReportConfig(qa_limit=args.items, tau2_n_tasks=0, bfcl_limit=0, bfcl_categories=[]).to_lib()
    arms: dict[str, ExpertSearchesStudentAnswers] = {}
    experts: list[QAExpertTeacher] = []  # one for both arms: its search plans are computed once

    def load(spec: ModelSpec) -> ExpertSearchesStudentAnswers:
        student = load_policy(spec.base_path, spec.adapter_path, max_new_tokens=lib.max_new_tokens, batch_size=lib.batch_size,
                              temperature=lib.temperature, seed=lib.seed, dtype=lib.dtype)
        experts[:] = experts or [QAExpertTeacher(search, items, student.tokenizer)]
        arms[spec.model_id] = ExpertSearchesStudentAnswers(experts[0], student, args.ask)
        return arms[spec.model_id]

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    report = run_comparison(Warehouse(args.out / "eval.duckdb"), ModelSpec("base", info.path), ModelSpec("adapter", info.path, str(args.adapter)),
                            lib, qa_items=items, search_tool=search, load_policy=load)
    print(f"answer_ceiling: {min(args.items, len(items))} items, {round(time.time() - t0)} s")
    for r in report.summary_rows():
        print(json.dumps({k: r.get(k) for k in ("suite", "metric", "n", "base", "candidate", "diff", "ci_low", "ci_high")}))
    for name, arm in arms.items():
        calls = [a for a in arm.answers if "<tool_call>" in a or a.lstrip().startswith("{")]
        texts = [a for a in arm.answers if a.strip() and a not in calls]
        print(json.dumps({"arm": name, "student_turns": len(arm.answers), "tool_calls": len(calls), "texts": len(texts),
                          "empty": len(arm.answers) - len(calls) - len(texts), "first_texts": [a[:120] for a in texts[:10]]}))


if __name__ == "__main__":
    main()
