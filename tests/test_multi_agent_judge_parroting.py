"""Multi-agent judges against parroting and junk (issue 29): a correct answer scores above an echo of the question plus junk."""
from __future__ import annotations

import pytest

from agenttune_lib.events import Event, EventKind, EventLog

TASK = "What is the capital of France?"
PARIS, SENTENCE = "Paris.", "The capital of France is Paris."
ECHO_JUNK = "What is the capital of France? blorp zzk"


def _episode(text: str, answer: str | None = "Paris") -> EventLog:
    meta = {"task": TASK, **({"answer": answer} if answer is not None else {})}
    return EventLog([Event(EventKind.OBSERVATION, {"content": TASK}), Event(EventKind.TEXT, {"content": text})], metadata=meta)


def test_the_answer_free_overlap_judge_cannot_rank_correctness():
    """The measured failure: topicality alone puts an echo plus junk (0.333) above the right sentence (0.267) and "Paris." at 0."""
    from agenttune_lib.multi_agent.judges import OverlapJudge

    judge = OverlapJudge("task", penalize_copy=True)
    scores = [judge.evaluate_trajectory(_episode(t)) for t in (ECHO_JUNK, SENTENCE, PARIS)]
    assert scores == pytest.approx([1 / 3, 0.8 / 3, 0.0])


def test_answer_judge_ranks_the_correct_answer_above_parroting_and_junk():
    from agenttune_lib.multi_agent.judges import AnswerJudge

    judge = AnswerJudge()
    score = {t: judge.evaluate_trajectory(_episode(t)) for t in (PARIS, SENTENCE, ECHO_JUNK, TASK, "blorp zzk qux",
                                                                  TASK + " Paris", "Paris banana kiwi", "paris PARIS Paris")}
    assert score[PARIS] == 1.0
    assert score[SENTENCE] == pytest.approx(0.6)  # right, but restating 4 of its 5 words from the question costs 0.4
    assert score[ECHO_JUNK] == score[TASK] == score["blorp zzk qux"] == 0.0
    assert score[TASK + " Paris"] == pytest.approx(1 - 0.5 * 5 / 6)  # the echo costs even with the answer appended
    assert score["Paris banana kiwi"] == pytest.approx(0.5) and score["paris PARIS Paris"] == pytest.approx(0.5)
    assert score[PARIS] > score[SENTENCE] > score[TASK + " Paris"] > score["Paris banana kiwi"] > score[ECHO_JUNK]


def test_a_panel_with_the_answer_judge_ranks_paris_above_the_echo():
    from agenttune_lib.multi_agent.judges import AnswerJudge, JudgeAdapter, OverlapJudge, aggregate_scores

    logs = [_episode(PARIS), _episode(SENTENCE), _episode(ECHO_JUNK)]
    scores = {"correct": JudgeAdapter("correct", AnswerJudge()).score(logs),
              "on_task": JudgeAdapter("on_task", OverlapJudge("task", penalize_copy=True)).score(logs)}
    paris, sentence, echo = aggregate_scores(scores, "weighted", {"correct": 2.0, "on_task": 1.0})
    assert paris == pytest.approx(2 / 3) and sentence == pytest.approx((1.2 + 0.8 / 3) / 3) and echo == pytest.approx(1 / 9)
    assert paris > echo > 0.0 and sentence > echo


def test_answer_judge_without_a_reference_answer_fails_naming_itself():
    from agenttune_lib.multi_agent.judges import AnswerJudge, JudgeAdapter, JudgeNodeError

    with pytest.raises(JudgeNodeError, match=r"judge 'correct' failed: ValueError: episode .* has no reference answer \(metadata\['answer'\]\)"):
        JudgeAdapter("correct", AnswerJudge()).score([_episode(PARIS, answer=None)])


def test_spec_accepts_the_answer_kind_and_names_it_when_a_kind_is_unknown():
    from agenttune_lib.multi_agent.spec import load_graph_spec

    policies = [{"name": "solver", "trainable": True}]
    spec = load_graph_spec({"name": "g", "policies": policies, "judges": [{"name": "correct", "kind": "answer"}]})
    assert spec.judges[0].kind == "answer"
    with pytest.raises(ValueError, match=r"judge 'bad' has kind 'bogus'; expected 'reward', 'llm', 'overlap' or 'answer'"):
        load_graph_spec({"name": "g", "policies": policies, "judges": [{"name": "bad", "kind": "bogus"}]})
