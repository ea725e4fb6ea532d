"""Compare two finished ``AGENTTUNE_HOME``s: do two runs hold the same data, the same adapter and the same scores?

Read-only. For each table (QA items, teacher trajectories, teacher events, held-out outputs) it prints the row counts, a sha-256 of the
ordered rows and how many rows differ; then the newest distilled adapter's step count, tokens seen, loss curve and
the largest absolute difference over its LoRA tensors; then the held-out comparisons (base -> candidate, the paired diff's 95 % interval) side by side. Use it to check
that a run under load trained what a quiet run trained: ``python bench/compare_homes.py runs/r6/.agenttune
runs/r7/.agenttune``. Exit status 1 when the data or the adapter differ.
"""
import argparse, hashlib, json, sys
from pathlib import Path

import duckdb
from safetensors.torch import load_file

TABLES = {
    "qa items": "select split, question, answer, gold_chunk_ids, hops from qa_items order by split, question, answer",
    "teacher trajectories": "select task, teacher_kind, n_events, reward_total, qa_item_ids, chunk_ids from trajectories "
    "where source = 'teacher' order by task, teacher_kind, reward_total, n_events, qa_item_ids",
    "teacher events": "select t.task, t.teacher_kind, e.seq, e.kind, e.payload, e.span_start, e.span_end from events e "
    "join trajectories t on t.id = e.trajectory_id where t.source = 'teacher' "
    "order by t.task, t.teacher_kind, t.reward_total, e.seq, e.payload",
    "held-out outputs": "select suite, item_id, model_label, output, score from evaluation_items "
    "order by suite, item_id, model_label, output",
}
SCORES = "select suite, metric, n, base_mean, candidate_mean, ci_low, ci_high from evaluation_comparisons order by suite, metric"
ADAPTER = "select path, metrics from adapters where algorithm = 'distill' order by created_at desc limit 1"


def connect(home: Path) -> duckdb.DuckDBPyConnection:
    db = home / "warehouse.duckdb"
    if not db.is_file():
        sys.exit(f"{home}: no warehouse.duckdb (is this an AGENTTUNE_HOME of a finished run?)")
    return duckdb.connect(str(db), read_only=True)


def rows(conn: duckdb.DuckDBPyConnection, sql: str) -> list | None:
    """The query's rows, or None where the home has no such table yet (a run stopped or selected before that asset)."""
    try:
        return conn.execute(sql).fetchall()
    except duckdb.CatalogException:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("home_a", type=Path)
    ap.add_argument("home_b", type=Path)
    args = ap.parse_args()
    a, b = connect(args.home_a), connect(args.home_b)
    differs = False
    for name, sql in TABLES.items():
        ra, rb = rows(a, sql), rows(b, sql)
        if ra is None or rb is None:
            missing = " and ".join(str(h) for h, r in ((args.home_a, ra), (args.home_b, rb)) if r is None)
            print(f"{name}: not in {missing}")
            differs |= (ra is None) != (rb is None)
            continue
        da, db = (hashlib.sha256(repr(r).encode()).hexdigest()[:16] for r in (ra, rb))
        n = sum(x != y for x, y in zip(ra, rb)) + abs(len(ra) - len(rb))
        differs |= n > 0
        print(f"{name}: {len(ra)} vs {len(rb)} rows, sha-256 {da} vs {db}, {n} rows differ")
    adapters = [(rows(c, ADAPTER) or [None])[0] for c in (a, b)]
    if None in adapters:
        print("adapter: none in", " and ".join(str(h) for h, x in zip((args.home_a, args.home_b), adapters) if x is None))
        return 1
    (pa, ma), (pb, mb) = ((Path(p), json.loads(m)) for p, m in adapters)
    for label, m in (("a", ma), ("b", mb)):
        print(f"adapter {label}: {m.get('steps')} steps, {m.get('tokens_seen')} tokens seen, loss {m.get('first_loss')} -> {m.get('final_loss')}")
    ta, tb = load_file(str(pa / "adapter_model.safetensors")), load_file(str(pb / "adapter_model.safetensors"))
    if ta.keys() != tb.keys():
        print("adapter tensors: different names")
        return 1
    worst = max((ta[k].float() - tb[k].float()).abs().max().item() for k in ta)
    same_curve = ma.get("loss_curve") == mb.get("loss_curve")
    differs |= worst != 0.0 or not same_curve
    print(f"adapter tensors: {len(ta)}, max abs difference {worst}; loss curves {'equal' if same_curve else 'DIFFER'}")
    sa = {(s, m): r for s, m, *r in a.execute(SCORES).fetchall()}
    sb = {(s, m): r for s, m, *r in b.execute(SCORES).fetchall()}
    fmt = lambda r: "-" if r is None else f"n={r[0]} {r[1]:.3f} -> {r[2]:.3f}, diff [{r[3]:.3f}, {r[4]:.3f}]"
    for key in sorted(sa.keys() | sb.keys()):
        print(f"  {key[0]}/{key[1]}: {fmt(sa.get(key))} | {fmt(sb.get(key))}{'' if sa.get(key) == sb.get(key) else '  <- differs'}")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
