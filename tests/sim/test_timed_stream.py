"""The replay as a stream: repeated traces made as they are read, pods dropped at their end, and the
bounded sample log whose mean allocation and peak queue are still over every event."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_timed_replay import write_trace

from gpuslice.sim.timed_metrics import SampleLog
from gpuslice.sim.timed_replay import ReplayConfig, _Replay
from gpuslice.sim.timed_trace import load_timed_trace, repeat_trace

events = st.lists(
    st.tuples(st.floats(0, 100, allow_nan=False), st.integers(0, 8000), st.integers(0, 50)), max_size=200
)


@settings(max_examples=80, deadline=None)
@given(events=events, limit=st.integers(2, 16))
def test_sample_log_is_bounded_and_its_aggregates_cover_every_event(events, limit: int) -> None:
    log, now, rows = SampleLog(limit), 0.0, []
    for dt, allocated, pending in events:
        now += dt
        log.add(now, allocated, pending, pending // 2)
        rows.append((now, allocated, pending, pending // 2))
    fields = log.fields()
    columns = ("sample_time", "allocated_gpu_milli", "pending", "running")
    kept = list(zip(*(fields[k].tolist() for k in columns), strict=True))
    assert len(kept) <= limit + 1
    if not rows:
        assert kept == [] and fields["peak_pending"] == 0
        return
    assert kept[-1] == rows[-1]  # the last state is always there
    evenly = rows[:: log.stride]  # every stride-th event, the stride doubling as the store fills
    assert kept == (evenly if len(rows) % log.stride == 1 or log.stride == 1 else [*evenly, rows[-1]])
    assert fields["peak_pending"] == max(r[2] for r in rows)
    times = np.array([r[0] for r in rows])
    spans = np.diff(times)
    if len(rows) < 2:
        assert fields["mean_allocated_gpu_milli"] == rows[-1][1]
    elif spans.sum() > 0:
        exact = float((np.array([r[1] for r in rows[:-1]]) * spans).sum() / spans.sum())
        assert np.isclose(fields["mean_allocated_gpu_milli"], exact, rtol=1e-9, atol=1e-6)


def test_a_repeated_trace_is_made_as_it_is_read(tmp_path: Path) -> None:
    pods = [("a", 1, "LS", 0, 0, 100), ("b", 1, "BE", 5, 6, 50), ("z", 0, "LS", 900, 900, 901)]
    write_trace(tmp_path, pods)
    trace = load_timed_trace("t", tmp_path)
    jobs = repeat_trace(trace, 3).jobs
    period = trace.end + 1.0
    expected = [(f"{j.name}#{k}", j.arrival + k * period) for k in range(3) for j in trace.jobs]
    assert [(j.name, j.arrival) for j in jobs] == expected
    assert [(jobs[i].name, jobs[i].arrival) for i in range(-len(jobs), len(jobs))] == expected * 2
    assert [j.name for j in jobs[2:5]] == [name for name, _ in expected[2:5]]
    assert not hasattr(jobs, "__dict__")  # nothing per pod is stored: only the one copy and the count


def test_the_replay_holds_a_pod_only_while_it_is_in_the_system(tmp_path: Path) -> None:
    # two one-GPU pods on a one-GPU node: the second waits; a 2-GPU pod fits nowhere, ever
    write_trace(
        tmp_path,
        [("a", 1, "LS", 0, 0, 100), ("b", 1, "LS", 10, 10, 60), ("big", 2, "LS", 20, 20, 30)],
    )
    trace = load_timed_trace("t", tmp_path)
    replay = _Replay(trace, ReplayConfig("bestfit", "fifo", False), None)
    seen: list[int] = []
    step = replay._step

    def counted(now: float) -> None:
        step(now)
        seen.append(len(replay.live))
        assert len(replay.live) == len(replay.pending) + len(replay.running)

    replay._step = counted  # type: ignore[method-assign]
    replay.run(None)
    assert max(seen) == 2 and replay.live == {}
    assert replay.pods.never_fits.tolist() == [False, False, True]


def _burst_trace(tmp_path: Path, pods: int, burst: int) -> Path:
    """``pods`` CPU-only pods arriving ``burst`` at a time, one second apart, each running 1 s."""
    rows = [(f"p{i}", 0, "LS", i // burst, i // burst, i // burst + 1) for i in range(pods)]
    return write_trace(tmp_path, rows)


def test_progress_is_told_every_thousand_arrivals_also_when_pods_arrive_several_at_a_time(
    tmp_path: Path,
) -> None:
    # 7 pods a step: the count of arrivals passes 1000, 2000, ... without landing on them (but at 7000)
    trace = load_timed_trace("t", _burst_trace(tmp_path, 7_007, 7))
    told: list[int] = []
    _Replay(trace, ReplayConfig("bestfit", "fifo", False), None).run(
        lambda arrived, total: told.append(arrived)
    )
    assert told[-1] == 7_007
    gaps = np.diff([0, *told])
    assert len(told) >= 7 and gaps.max() <= 1_000 + 7


def test_a_timed_trace_is_read_in_one_pass_with_its_size_told_as_it_goes(tmp_path: Path) -> None:
    path = _burst_trace(tmp_path, 40_000, 40) / "openb_pod_list_t.csv"
    size, told, opened = path.stat().st_size, [], []
    real_open = Path.open

    def counting_open(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(self.name)
        return real_open(self, *args, **kwargs)

    with mock.patch.object(Path, "open", counting_open):
        trace = load_timed_trace("t", tmp_path, lambda done, total: told.append((done, total)))
    assert opened.count(path.name) == 1  # a million-pod trace is read once, not once per column set
    assert len(trace.jobs) == 40_000
    assert len(told) >= 2 and all(total == size for _, total in told)
    assert [done for done, _ in told] == sorted(done for done, _ in told) and 0 < told[-1][0] <= size


def test_pods_asking_the_same_share_one_request(tmp_path: Path) -> None:
    trace = load_timed_trace("t", _burst_trace(tmp_path, 500, 5))
    assert len({id(j.request) for j in trace.jobs}) == 1  # 500 equal asks: one (frozen) Request held
