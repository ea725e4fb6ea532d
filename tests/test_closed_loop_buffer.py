"""TrainingBuffer and RetrainingTrigger: durable counters, FIFO cap, atomic drain, T1-T6 and the gates."""
from __future__ import annotations

import datetime as dt
import multiprocessing as mp

import pytest

from agenttune_lib.closed_loop import RetrainingTrigger, TrainingBuffer, TriggerConfig
from agenttune_lib.closed_loop.buffer import BufferError, RetrainRunning
from agenttune_lib.warehouse import Warehouse
from _closed_loop_helpers import make_example

UTC = dt.timezone.utc


@pytest.fixture
def wh(tmp_path):
    return Warehouse(tmp_path / "wh.duckdb")


def _scan(wh, name="default"):
    """Recompute the counters from the rows: the reference the maintained counters must equal."""
    rows = wh.execute("SELECT root_cause, count(*), count(*) FILTER (WHERE accepted) FROM training_buffer WHERE buffer = ? GROUP BY 1", [name])
    return {c: (n, a) for c, n, a in rows}


def test_counters_match_rows_and_survive_a_new_process_view(wh):
    buf = TrainingBuffer(wh, capacity=100)
    buf.add([make_example(i, "loop_collapse") for i in range(8)] + [make_example(100 + i, "wrong_tool", accepted=False) for i in range(3)])
    again = TrainingBuffer(Warehouse(wh.path), capacity=100)  # a fresh handle: nothing held in memory
    st = again.stats()
    assert st.size == 11 and st.accepted == 8 and st.attempts == 11 and st.dropped == 3
    assert st.counts == {"loop_collapse": 8, "wrong_tool": 3}
    assert {c: n for c, (n, _) in _scan(wh).items()} == st.counts
    assert st.leader_cause == "loop_collapse" and st.leader_n == 8


def test_readding_the_same_failure_is_ignored(wh):
    buf = TrainingBuffer(wh)
    assert buf.add([make_example(1)]) == 1
    assert buf.add([make_example(1)]) == 0
    assert buf.stats().size == 1 and buf.stats().attempts == 1


def test_fifo_cap_evicts_oldest_and_keeps_counts_exact(wh):
    buf = TrainingBuffer(wh, capacity=10)
    buf.add([make_example(i, "wrong_tool") for i in range(7)])
    buf.add([make_example(100 + i, "loop_collapse", accepted=(i % 2 == 0)) for i in range(6)])
    st = buf.stats()
    assert st.size == 10
    scan = _scan(wh)
    assert st.counts == {c: n for c, (n, _) in scan.items()} == {"wrong_tool": 4, "loop_collapse": 6}
    assert st.accepted == sum(a for _, a in scan.values()) == 4 + 3
    assert [e.trajectory_id for e in buf.examples()][:1] == ["traj-3"]
    assert st.leader_cause == "loop_collapse" and st.leader_n == 6


def test_drain_is_atomic_and_resets_current_counts(wh):
    buf = TrainingBuffer(wh)
    buf.add([make_example(i) for i in range(5)])
    batch = buf.drain(trigger="T1", run_id="r1")
    assert len(batch.examples) == 5 and len(batch.dpo_rows()) == 5
    st = buf.stats()
    assert st.size == 0 and st.accepted == 0 and st.retrain_batch == batch.batch_id
    with pytest.raises(RetrainRunning):
        buf.add([make_example(10)])
        buf.drain()
    buf.finish_retrain(batch.batch_id, succeeded=True)
    st = buf.stats()
    assert st.retrain_batch is None and st.last_retrain_at is not None and st.size == 1
    with pytest.raises(BufferError):
        buf.finish_retrain(batch.batch_id, succeeded=True)


def test_failed_retrain_can_requeue(wh):
    buf = TrainingBuffer(wh)
    buf.add([make_example(i) for i in range(4)])
    batch = buf.drain()
    buf.finish_retrain(batch.batch_id, succeeded=False, requeue=True)
    st = buf.stats()
    assert st.size == 4 and st.accepted == 4 and st.last_retrain_at is None


def _drain_worker(path, q):
    from agenttune_lib.closed_loop.buffer import BufferError, TrainingBuffer
    from agenttune_lib.warehouse import Warehouse

    try:
        batch = TrainingBuffer(Warehouse(path)).drain()
        q.put(("ok", len(batch.examples)))
    except BufferError as exc:
        q.put(("refused", type(exc).__name__))


@pytest.mark.slow
def test_drain_across_processes_hands_out_one_batch(wh):
    buf = TrainingBuffer(wh)
    buf.add([make_example(i) for i in range(20)])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_drain_worker, args=(wh.path, q)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    results = [q.get(timeout=5) for _ in procs]
    assert sorted(r[0] for r in results) == ["ok", "refused", "refused"]
    assert [r[1] for r in results if r[0] == "ok"] == [20]
    assert wh.execute("SELECT count(*) FROM training_buffer_batch_rows")[0][0] == 20


# -- the trigger ---------------------------------------------------------------------------------

def _eval(buf, now=None, **cfg):
    return RetrainingTrigger(TriggerConfig(**cfg)).evaluate(buf.stats(), now=now)


def test_t1_t2_t3_defaults(wh):
    buf = TrainingBuffer(wh)
    buf.add([make_example(i, "loop_collapse") for i in range(35)] + [make_example(100 + i, "wrong_tool", accepted=False) for i in range(15)])
    d = _eval(buf)
    assert {f.trigger for f in d.firings} >= {"T1", "T2", "T3"}
    t2 = d.firing("T2")
    assert t2.name == "dominance:loop_collapse" and t2.figures["share"] == pytest.approx(0.7)
    assert d.should_retrain


def test_t3_counts_examples_currently_buffered_not_lifetime(wh):
    """The paper's T3 latches on a lifetime count and fires forever after the first retrain."""
    buf = TrainingBuffer(wh)
    buf.add([make_example(i) for i in range(30)])
    assert _eval(buf).firing("T3")
    batch = buf.drain()
    buf.finish_retrain(batch.batch_id, succeeded=True)
    buf.add([make_example(1000)])
    d = _eval(buf)
    assert d.firing("T3") is None and d.firings == ()


def test_t4_reward_drift_over_windows(wh):
    buf = TrainingBuffer(wh, reward_window=50)
    buf.add(rewards=[0.8 if i % 2 else 0.9 for i in range(50)])  # baseline mean .85, std .05
    buf.add(rewards=[0.84] * 50)
    assert _eval(buf).firing("T4") is None
    buf.add(rewards=[0.70] * 50)  # the ring buffer replaces the whole window
    st = buf.stats()
    assert st.window_mean == pytest.approx(0.70) and st.window_n == 50
    f = _eval(buf).firing("T4")
    assert f and f.figures["floor"] == pytest.approx(0.85 - 1.5 * 0.05)


def test_t5_novel_cause_recurs(wh):
    buf = TrainingBuffer(wh)
    buf.add([make_example(i, "loop_collapse") for i in range(3)])
    batch = buf.drain()
    buf.finish_retrain(batch.batch_id, succeeded=True)
    buf.add([make_example(10 + i, "loop_collapse") for i in range(5)] + [make_example(20 + i, "hallucinated_output") for i in range(2)])
    assert _eval(buf).firing("T5") is None  # loop_collapse was trained on; the new one only twice
    buf.add([make_example(30, "hallucinated_output")])
    f = _eval(buf).firing("T5")
    assert f and f.name == "novel_failure:hallucinated_output" and f.figures["count"] == 3


def test_t6_staleness_needs_min_buffer(wh):
    buf = TrainingBuffer(wh)
    buf.add([make_example(i) for i in range(9)])
    later = dt.datetime.now(UTC) + dt.timedelta(hours=7)
    assert _eval(buf, now=later).firing("T6") is None
    buf.add([make_example(50)])
    assert _eval(buf).firing("T6") is None
    assert _eval(buf, now=later).firing("T6")


def test_gates_block_running_retrain_and_bad_buffers(wh):
    buf = TrainingBuffer(wh)
    buf.add([make_example(i, accepted=(i < 3)) for i in range(60)])
    d = _eval(buf)
    assert d.firing("T1") and d.blocked_by == "drop_rate" and not d.should_retrain
    buf2 = TrainingBuffer(wh, name="b2")
    buf2.add([make_example(i) for i in range(60)])
    buf2.drain()
    buf2.add([make_example(100 + i) for i in range(60)])
    d2 = _eval(buf2)
    assert d2.firing("T1") and d2.blocked_by == "retrain_running"


def test_bad_input_names_the_problem(wh):
    buf = TrainingBuffer(wh)
    with pytest.raises(ValueError, match="reward"):
        buf.add(rewards=[float("nan")])
    with pytest.raises(TypeError, match="TrainingExample"):
        buf.add(["nope"])
    with pytest.raises(BufferError, match="empty"):
        buf.drain()
    assert buf.stats().size == 0
