"""The 26 registered reward functions (paper Table 14 / Appendix C), one float per completion.

Every function takes ``completions`` (text or chat messages) plus dataset columns as
kwargs, TRL's calling convention. Each documented tier is reachable; a missing required
column is a clear error, never a silent zero.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.rl.rewards._text import (
    content_words,
    final_answer,
    full_text,
    messages_of,
    parse_number,
    parse_numbers,
    per_item,
    tool_calls,
    tool_results,
)

Completions = Sequence[Any]


def _close(a: float, b: float, rel: float, abs_tol: float = 0.0) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


# -- correctness and structure (SQL-agent family) -------------------------------------------
_YES_NO = re.compile(r"\b(yes|no)\b", re.I)


def correctness_reward(completions: Completions, answer: Any = None, **kwargs: Any) -> list[float]:
    """Yes/no correctness: +0.6 the parsed yes/no matches ``answer``, -1.0 it contradicts it, -0.5 none parsed."""
    answers = per_item({"answer": answer}, "answer", len(completions), True, "correctness_reward")
    out = []
    for comp, gold in zip(completions, answers):
        found = _YES_NO.findall(final_answer(comp))
        if not found:
            out.append(-0.5)
            continue
        said = found[-1].lower()
        gold_m = _YES_NO.search(str(gold))
        out.append(0.6 if gold_m and said == gold_m.group(1).lower() else -1.0)
    return out


def structure_reward(completions: Completions, **kwargs: Any) -> list[float]:
    """Call -> response -> content shape: +0.1 a well-formed call answered by a tool, +0.05 closing content,
    -0.15 a call with no tool response, -0.1 per malformed call; 0.0 when no call is attempted."""
    out = []
    for comp in completions:
        msgs = messages_of(comp)
        calls, errors = tool_calls(comp)
        has_response = any(m.get("role") == "tool" for m in msgs)
        score = -0.1 * errors
        if calls:
            score += 0.1 if has_response else -0.15
            last = msgs[-1]
            if has_response and last.get("role", "assistant") == "assistant" and final_answer([last]).strip():
                score += 0.05
        out.append(round(score, 6) + 0.0)
    return out


_SQL = re.compile(r"\b(select|with)\b.+?(?:;|$)", re.I | re.S)


def _sql_queries(comp: Any) -> list[str]:
    calls, _ = tool_calls(comp)
    queries = [str(c.arguments.get("query", c.arguments.get("sql", ""))) for c in calls if c.arguments.get("query") or c.arguments.get("sql")]
    queries += re.findall(r"```sql\s*(.*?)```", full_text(comp), re.S | re.I)
    return [q.strip() for q in queries if q.strip()]


def query_reward(completions: Completions, **kwargs: Any) -> list[float]:
    """SQL heuristic: 0.3 for issuing queries, -0.2 above 3 queries, -0.1 per ``LIMIT 1``, -0.1 per SELECT without WHERE."""
    out = []
    for comp in completions:
        queries = _sql_queries(comp)
        if not queries:
            out.append(0.0)
            continue
        score = 0.3
        if len(queries) > 3:
            score -= 0.2
        for q in queries:
            if re.search(r"\blimit\s+1\b", q, re.I):
                score -= 0.1
            if re.match(r"\s*select\b", q, re.I) and not re.search(r"\bwhere\b", q, re.I):
                score -= 0.1
        out.append(round(max(score, -0.5), 6))
    return out


def sql_format_reward(completions: Completions, **kwargs: Any) -> list[float]:
    """SQL shape: 1.0 every query starts SELECT/WITH with balanced parentheses and quotes, 0.5 some do, 0.0 none/no SQL."""
    out = []
    for comp in completions:
        queries = _sql_queries(comp)
        if not queries:
            out.append(0.0)
            continue
        ok = [bool(re.match(r"\s*(select|with)\b", q, re.I)) and q.count("(") == q.count(")") and q.count("'") % 2 == 0 for q in queries]
        out.append(1.0 if all(ok) else 0.5 if any(ok) else 0.0)
    return out


# -- use-case rewards -----------------------------------------------------------------------
def reward_correct_answer(completions: Completions, answer: Any = None, **kwargs: Any) -> list[float]:
    """Numeric match of the final answer: 1.5 exact (within 1e-3), 0.5 within 1%, else 0.0."""
    answers = per_item({"answer": answer}, "answer", len(completions), True, "reward_correct_answer")
    out = []
    for comp, gold in zip(completions, answers):
        got = parse_number(final_answer(comp))
        want = gold if isinstance(gold, (int, float)) else parse_number(str(gold))
        if got is None or want is None:
            out.append(0.0)
        elif abs(got - float(want)) <= 1e-3:
            out.append(1.5)
        elif _close(got, float(want), 0.01):
            out.append(0.5)
        else:
            out.append(0.0)
    return out


def reward_tool_used(completions: Completions, tool_call_counts: Any = None, **kwargs: Any) -> list[float]:
    """1.0 if any message has ``role: tool`` (or the rollout counted a tool call), else 0.0."""
    counts = per_item({"c": tool_call_counts}, "c", len(completions), False, "reward_tool_used")
    return [1.0 if any(m.get("role") == "tool" for m in messages_of(c)) or (n or 0) > 0 else 0.0 for c, n in zip(completions, counts)]


def reward_concise_answer(completions: Completions, max_words: int = 80, **kwargs: Any) -> list[float]:
    """0.3 if the final answer is non-empty and at most ``max_words`` words, else 0.0."""
    out = []
    for comp in completions:
        words = final_answer(comp).split()
        out.append(0.3 if 0 < len(words) <= max_words else 0.0)
    return out


def format_reward(completions: Completions, **kwargs: Any) -> list[float]:
    """Output contract: 1.0 a well-formed ``<tool_call>`` or ``<answer>`` block, -0.5 a malformed call, 0.0 neither."""
    out = []
    for comp in completions:
        calls, errors = tool_calls(comp)
        if errors:
            out.append(-0.5)
        elif calls or re.search(r"<answer>.+?</answer>", full_text(comp), re.S):
            out.append(1.0)
        else:
            out.append(0.0)
    return out


def search_grounding_reward(completions: Completions, retrieved: Any = None, **kwargs: Any) -> list[float]:
    """Retrieval grounding: share of the answer's content words found in what the agent retrieved (0..1)."""
    docs = per_item({"r": retrieved}, "r", len(completions), False, "search_grounding_reward")
    out = []
    for comp, r in zip(completions, docs):
        words = content_words(final_answer(comp))
        seen = content_words(" ".join(tool_results(comp, r)))
        out.append(len(words & seen) / len(words) if words and seen else 0.0)
    return out


_CITE = re.compile(r"\[(?:(?:doc|chunk|msg|message|id|source)[:_ #-]*)?([A-Za-z0-9_.:-]+)\]")


def message_id_citation_reward(completions: Completions, retrieved: Any = None, **kwargs: Any) -> list[float]:
    """Citations ``[id]`` in the answer: +1.0 × share that name a retrieved id, -0.5 if any cites an id never retrieved."""
    docs = per_item({"r": retrieved}, "r", len(completions), False, "message_id_citation_reward")
    out = []
    for comp, r in zip(completions, docs):
        cited = _CITE.findall(final_answer(comp))
        if not cited:
            out.append(0.0)
            continue
        seen_text = " ".join(tool_results(comp, r))
        valid = [c for c in cited if c in seen_text]
        score = len(valid) / len(cited)
        out.append(round(score - (0.5 if len(valid) < len(cited) else 0.0), 6))
    return out


def answer_format_reward(completions: Completions, **kwargs: Any) -> list[float]:
    """1.0 the final text carries an ``<answer>…</answer>`` or ``Final answer:`` marker with content, else 0.0."""
    out = []
    for comp in completions:
        text = full_text(comp)
        ok = re.search(r"<answer>\s*\S.*?</answer>", text, re.S) or re.search(r"final answer\s*:\s*\S", text, re.I)
        out.append(1.0 if ok else 0.0)
    return out


def _norm_tokens(text: str) -> list[str]:
    text = re.sub(r"[^a-z0-9. ]", " ", str(text).lower())
    return [t for t in text.split() if t not in ("a", "an", "the")]


def answer_correctness_reward(completions: Completions, answer: Any = None, **kwargs: Any) -> list[float]:
    """Answer match against ``answer``: 1.0 normalized exact match, else token F1 (0..1)."""
    answers = per_item({"answer": answer}, "answer", len(completions), True, "answer_correctness_reward")
    out = []
    for comp, gold in zip(completions, answers):
        got, want = _norm_tokens(final_answer(comp)), _norm_tokens(str(gold))
        if got and got == want:
            out.append(1.0)
            continue
        common = sum(min(got.count(t), want.count(t)) for t in set(got))
        if not got or not want or common == 0:
            out.append(0.0)
            continue
        p, r = common / len(got), common / len(want)
        out.append(round(min(2 * p * r / (p + r), 0.99), 6))
    return out


# -- templated-answer rewards (FinQA family, plain versions) --------------------------------
_PLACEHOLDER = re.compile(r"\{\{?\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}?\}")


def placeholder_coverage_reward(completions: Completions, placeholders: Any = None, **kwargs: Any) -> list[float]:
    """Share of the required ``placeholders`` names the answer mentions or fills (0..1)."""
    needed = per_item({"p": placeholders}, "p", len(completions), True, "placeholder_coverage_reward")
    out = []
    for comp, names in zip(completions, needed):
        names = [names] if isinstance(names, str) else list(names or [])
        text = full_text(comp).lower()
        out.append(sum(1 for n in names if n.lower() in text) / len(names) if names else 0.0)
    return out


def template_structure_reward(completions: Completions, sections: Any = None, **kwargs: Any) -> list[float]:
    """Share of the required ``sections`` headings present in order (default Reasoning, Answer)."""
    wanted = per_item({"s": sections}, "s", len(completions), False, "template_structure_reward")
    out = []
    for comp, secs in zip(completions, wanted):
        secs = list(secs) if secs else ["Reasoning", "Answer"]
        text, pos, hits = full_text(comp), 0, 0
        for s in secs:
            m = re.compile(rf"(^|\n)\s*#*\s*{re.escape(s)}\s*[:：\n]", re.I).search(text, pos)
            if m:
                hits, pos = hits + 1, m.end()
        out.append(hits / len(secs))
    return out


def computation_reward(completions: Completions, answer: Any = None, **kwargs: Any) -> list[float]:
    """1.0 a calculator/python tool result matches ``answer`` (1%), 0.5 a computation tool was called, else 0.0."""
    answers = per_item({"answer": answer}, "answer", len(completions), True, "computation_reward")
    out = []
    for comp, gold in zip(completions, answers):
        calls, _ = tool_calls(comp)
        computed = [c for c in calls if re.search(r"calc|python|math|compute|eval", c.name, re.I)]
        want = gold if isinstance(gold, (int, float)) else parse_number(str(gold))
        results = [n for t in tool_results(comp) for n in parse_numbers(t)]
        if computed and want is not None and any(_close(n, float(want), 0.01, 1e-9) for n in results):
            out.append(1.0)
        else:
            out.append(0.5 if computed else 0.0)
    return out


def numerical_match_reward(completions: Completions, answer: Any = None, **kwargs: Any) -> list[float]:
    """Graded numeric match: max(0, 1 - 10 × relative error) of the closest number in the final answer."""
    answers = per_item({"answer": answer}, "answer", len(completions), True, "numerical_match_reward")
    out = []
    for comp, gold in zip(completions, answers):
        want = gold if isinstance(gold, (int, float)) else parse_number(str(gold))
        got = parse_numbers(final_answer(comp))
        if want is None or not got:
            out.append(0.0)
            continue
        rel = min(abs(g - float(want)) / max(abs(float(want)), 1e-9) for g in got)
        out.append(round(max(0.0, 1.0 - 10.0 * rel), 6))
    return out


def exploration_reward(completions: Completions, **kwargs: Any) -> list[float]:
    """Tool-call diversity: distinct (name, arguments) calls over all calls; 0.0 with no calls."""
    out = []
    for comp in completions:
        calls, _ = tool_calls(comp)
        out.append(len({c.key() for c in calls}) / len(calls) if calls else 0.0)
    return out


def tool_chain_reward(completions: Completions, expected_tools: Any = None, **kwargs: Any) -> list[float]:
    """Longest common subsequence of the called tool names and ``expected_tools``, over the expected length."""
    wanted = per_item({"e": expected_tools}, "e", len(completions), True, "tool_chain_reward")
    out = []
    for comp, exp in zip(completions, wanted):
        exp = [exp] if isinstance(exp, str) else list(exp or [])
        got = [c.name for c in tool_calls(comp)[0]]
        if not exp:
            out.append(1.0 if not got else 0.0)
            continue
        table = [[0] * (len(got) + 1) for _ in range(len(exp) + 1)]
        for i, a in enumerate(exp):
            for j, b in enumerate(got):
                table[i + 1][j + 1] = table[i][j] + 1 if a == b else max(table[i][j + 1], table[i + 1][j])
        out.append(table[-1][-1] / len(exp))
    return out


def summary_written_reward(completions: Completions, min_words: int = 20, **kwargs: Any) -> list[float]:
    """1.0 a write tool received non-empty content or the answer has a Summary of ``min_words``+ words; 0.5 a shorter one."""
    out = []
    for comp in completions:
        calls, _ = tool_calls(comp)
        wrote = any(re.search(r"write|save|summar", c.name, re.I) and any(str(v).strip() for v in c.arguments.values()) for c in calls)
        m = re.search(r"summary\s*[:：\n](.*)", full_text(comp), re.I | re.S)
        words = len(m.group(1).split()) if m else 0
        out.append(1.0 if wrote or words >= min_words else 0.5 if words > 0 else 0.0)
    return out


# -- process rewards ------------------------------------------------------------------------
def hybrid_prm_reward(completions: Completions, answer: Any = None, **kwargs: Any) -> list[float]:
    """Process reward: mean step score (+1 a call answered without error, -1 an error result or malformed call,
    -0.5 an exact repeat), blended 50/50 with outcome correctness when ``answer`` is given. No calls: outcome only."""
    answers = per_item({"answer": answer}, "answer", len(completions), False, "hybrid_prm_reward")
    out = []
    for comp, gold in zip(completions, answers):
        msgs = messages_of(comp)
        calls, errors = tool_calls(comp)
        results = [m for m in msgs if m.get("role") == "tool"]
        steps: list[float] = []
        seen: set[str] = set()
        for i, call in enumerate(calls):
            res = results[i] if i < len(results) else None
            text = str(res.get("content", "")) if res else ""
            failed = res is None or text.lower().startswith("error") or '"error"' in text
            score = -1.0 if failed else 1.0
            if call.key() in seen:
                score = min(score, -0.5)
            seen.add(call.key())
            steps.append(score)
        steps += [-1.0] * errors
        process = sum(steps) / len(steps) if steps else None
        outcome = None
        if gold is not None:
            outcome = answer_correctness_reward([comp], answer=[gold])[0] * 2.0 - 1.0
        parts = [p for p in (process, outcome) if p is not None]
        out.append(round(sum(parts) / len(parts), 6) if parts else 0.0)
    return out


class RewardError(RuntimeError):
    """A reward function could not score its input; raised instead of returning a dead signal."""


def distilled_judge_reward(completions: Completions, prompts: Any = None, judge: Any = None, **kwargs: Any) -> list[float]:
    """A compact learned scorer over prompt + completion: ``judge`` is a transformers text-classification pipeline
    or any callable ``list[str] -> list[float]``. Failures raise RewardError, never zeros."""
    if judge is None:
        raise RewardError("distilled_judge_reward needs judge= (a text-classification pipeline or a callable list[str] -> list[float])")
    prompt_list = per_item({"p": prompts}, "p", len(completions), False, "distilled_judge_reward")
    texts = [f"{full_text(p) if p is not None else ''}\n\n{full_text(c)}".strip() for p, c in zip(prompt_list, completions)]
    try:
        raw = judge(texts)
    except Exception as exc:
        raise RewardError(f"distilled_judge_reward: the judge failed: {type(exc).__name__}: {exc}") from exc
    scores = []
    for item in raw:
        if isinstance(item, list):
            item = max(item, key=lambda d: d.get("score", 0.0))
        if isinstance(item, dict):
            label = str(item.get("label", "")).lower()
            score = float(item["score"])
            scores.append(1.0 - score if label in ("label_0", "negative", "bad", "0") else score)
        else:
            scores.append(float(item))
    if len(scores) != len(completions) or not all(math.isfinite(s) for s in scores):
        raise RewardError(f"distilled_judge_reward: the judge returned {len(scores)} usable scores for {len(completions)} completions")
    return scores


# -- FinQA variants (numerically careful) ---------------------------------------------------
def finqa_format_reward(completions: Completions, **kwargs: Any) -> list[float]:
    """FinQA program format: 1.0 both ``Program: op(a, b), …`` and a numeric ``Answer:``, 0.5 one of them, else 0.0."""
    out = []
    for comp in completions:
        text = full_text(comp)
        prog = re.search(r"program\s*:\s*[a-z_]+\(\s*[^()]+\)(\s*,\s*[a-z_]+\(\s*[^()]+\))*", text, re.I)
        ans = re.search(r"answer\s*:\s*[-+$(]?\d", text, re.I)
        out.append(1.0 if prog and ans else 0.5 if prog or ans else 0.0)
    return out


def _grounding(completions: Completions, pattern: str, fn_name: str) -> list[float]:
    out = []
    for comp in completions:
        msgs = messages_of(comp)
        calls, _ = tool_calls(comp)
        names = [c.name for c in calls]
        tool_msgs = [m for m in msgs if m.get("role") == "tool"]
        grounded_texts = [str(m.get("content", "")) for i, m in enumerate(tool_msgs) if re.search(pattern, str(m.get("name", names[i] if i < len(names) else "")), re.I)]
        nums = parse_numbers(final_answer(comp), scaled=True)
        pool = [n for t in grounded_texts for n in parse_numbers(t, scaled=True) + parse_numbers(t)]
        if not nums or not pool:
            out.append(0.0)
            continue
        out.append(sum(1 for n in nums if any(_close(n, p, 1e-6, 1e-9) for p in pool)) / len(nums))
    return out


def finqa_sql_grounding_reward(completions: Completions, **kwargs: Any) -> list[float]:
    """Share of the answer's numbers that appear in SQL tool results (0..1)."""
    return _grounding(completions, r"sql|query|database|table", "finqa_sql_grounding_reward")


def finqa_calculator_grounding_reward(completions: Completions, **kwargs: Any) -> list[float]:
    """Share of the answer's numbers produced by a calculator tool (0..1)."""
    return _grounding(completions, r"calc|python|math|compute", "finqa_calculator_grounding_reward")


def finqa_placeholder_coverage_reward(completions: Completions, placeholders: Any = None, **kwargs: Any) -> list[float]:
    """Required placeholders filled with numbers: share filled, -0.5 if any ``{{name}}`` is left unfilled."""
    needed = per_item({"p": placeholders}, "p", len(completions), True, "finqa_placeholder_coverage_reward")
    out = []
    for comp, names in zip(completions, needed):
        names = [names] if isinstance(names, str) else list(names or [])
        text = full_text(comp)
        leftover = {m.lower() for m in _PLACEHOLDER.findall(text)}
        filled = [n for n in names if n.lower() not in leftover and re.search(rf"{re.escape(n)}\s*[:=]\s*[-+$(]?\d", text, re.I)]
        share = len(filled) / len(names) if names else 0.0
        out.append(round(share - (0.5 if leftover & {n.lower() for n in names} else 0.0), 6))
    return out


def finqa_answer_correctness_reward(completions: Completions, answer: Any = None, **kwargs: Any) -> list[float]:
    """Unit-aware numeric match (%, million, accounting negatives): 1.0 within 0.1%, 0.5 within 1%, else 0.0."""
    answers = per_item({"answer": answer}, "answer", len(completions), True, "finqa_answer_correctness_reward")
    out = []
    for comp, gold in zip(completions, answers):
        want = float(gold) if isinstance(gold, (int, float)) else parse_number(str(gold), scaled=True)
        text = final_answer(comp)
        candidates = parse_numbers(text, scaled=True) + parse_numbers(text)
        if want is None or not candidates:
            out.append(0.0)
            continue
        best = min(abs(c - want) / max(abs(want), 1e-9) for c in candidates)
        out.append(1.0 if best <= 1e-3 else 0.5 if best <= 1e-2 else 0.0)
    return out


REWARD_REGISTRY: dict[str, Callable[..., list[float]]] = {
    "correctness_reward": correctness_reward,
    "structure_reward": structure_reward,
    "query_reward": query_reward,
    "reward_correct_answer": reward_correct_answer,
    "reward_tool_used": reward_tool_used,
    "reward_concise_answer": reward_concise_answer,
    "format_reward": format_reward,
    "search_grounding_reward": search_grounding_reward,
    "message_id_citation_reward": message_id_citation_reward,
    "answer_format_reward": answer_format_reward,
    "answer_correctness_reward": answer_correctness_reward,
    "placeholder_coverage_reward": placeholder_coverage_reward,
    "template_structure_reward": template_structure_reward,
    "computation_reward": computation_reward,
    "numerical_match_reward": numerical_match_reward,
    "exploration_reward": exploration_reward,
    "hybrid_prm_reward": hybrid_prm_reward,
    "distilled_judge_reward": distilled_judge_reward,
    "tool_chain_reward": tool_chain_reward,
    "summary_written_reward": summary_written_reward,
    "sql_format_reward": sql_format_reward,
    "finqa_format_reward": finqa_format_reward,
    "finqa_sql_grounding_reward": finqa_sql_grounding_reward,
    "finqa_calculator_grounding_reward": finqa_calculator_grounding_reward,
    "finqa_placeholder_coverage_reward": finqa_placeholder_coverage_reward,
    "finqa_answer_correctness_reward": finqa_answer_correctness_reward,
}


def environment_reward(completions: Completions, env_reward: Any = None, **kwargs: Any) -> list[float]:
    """The environment's own episode reward (τ² database state, QA answer match, single-call AST match).

    Needs the ``env_reward`` column the rollout fills from each episode's Environment; an episode
    that ran in no environment is an error, never a zero.
    """
    values = per_item({"env_reward": env_reward}, "env_reward", len(completions), True, "environment_reward")
    missing = [i for i, v in enumerate(values) if v is None]
    if missing:
        raise RewardError(f"environment_reward: items {missing[:5]} ran in no environment (their dataset rows name none)")
    return [float(v) for v in values]


#: Rewards read from the episode's environment (not part of Table 14's 26 text rewards).
ENVIRONMENT_REWARDS: dict[str, Callable[..., list[float]]] = {"environment_reward": environment_reward}
