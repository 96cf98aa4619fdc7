"""The timed replay: queueing, ordering, EASY backfill, preemption and the trace's time columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuslice.errors import TraceFormatError
from gpuslice.sim.queue_setups import estimates_for, queue_setup
from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
from gpuslice.sim.timed_trace import load_timed_trace, repeat_trace
from gpuslice.sim.trace import NODE_FILE

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)


def write_trace(tmp_path: Path, pods: list[tuple], gpus: int = 1) -> Path:
    """Pods as (name, num_gpu, qos, creation, scheduled, deletion) on one node of ``gpus`` GPUs."""
    (tmp_path / NODE_FILE).write_text(f"sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,{gpus},V100M16\n")
    rows = [
        f"{name},1000,1024,{num_gpu},{1000 if num_gpu else 0},,{qos},Running,{c},{d},{s}"
        for name, num_gpu, qos, c, s, d in pods
    ]
    (tmp_path / "openb_pod_list_t.csv").write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return tmp_path


def run(tmp_path: Path, setup: str, load: float = 1.0, placement: str = "bestfit"):
    trace = load_timed_trace("t", tmp_path)
    chosen = queue_setup(setup)
    config = ReplayConfig(placement, chosen.queue, chosen.backfill, load, label=chosen.name)
    result = replay_timed(trace, config, estimates_for(trace.jobs, chosen))
    by_name = {j.name: i for i, j in enumerate(trace.jobs)}
    return result, by_name


def test_a_pod_waits_while_its_gpu_is_taken_and_starts_when_it_is_released(tmp_path: Path) -> None:
    write_trace(
        tmp_path, [("a", 1, "LS", 0, 0, 100), ("b", 1, "LS", 10, 10, 60), ("end", 0, "LS", 5000, 5000, 5001)]
    )
    result, at = run(tmp_path, "fifo")
    b = at["b"]
    assert result.start[b] == 100 and result.waited[b] == 90
    assert result.jct[b] == 140  # waited 90, ran its recorded 50
    record = result.record()
    assert record["recorded_wait_s"]["all"]["mean"] == 0.0  # production started both at once
    assert record["wait_s"]["all"]["n"] == 2  # the censored last pod is left out


def test_sjf_with_true_durations_runs_the_short_job_before_the_long_one(tmp_path: Path) -> None:
    pods = [
        ("a", 1, "LS", 0, 0, 100),
        ("long", 1, "LS", 1, 1, 1001),
        ("short", 1, "LS", 2, 2, 12),
        ("z", 0, "LS", 9000, 9000, 9001),
    ]
    write_trace(tmp_path, pods)
    fifo, at = run(tmp_path, "fifo")
    sjf, _ = run(tmp_path, "sjf-oracle")
    assert fifo.start[at["long"]] == 100 and fifo.start[at["short"]] == 1100
    assert sjf.start[at["short"]] == 100 and sjf.start[at["long"]] == 110
    assert sjf.jct[at["short"]] + sjf.jct[at["long"]] < fifo.jct[at["short"]] + fifo.jct[at["long"]]


def test_easy_backfill_starts_a_later_job_that_ends_before_the_blocked_head(tmp_path: Path) -> None:
    pods = [
        ("a", 1, "LS", 0, 0, 100),
        ("wide", 2, "LS", 1, 1, 11),
        ("small", 1, "LS", 2, 2, 52),
        ("z", 0, "LS", 9000, 9000, 9001),
    ]
    write_trace(tmp_path, pods, gpus=2)
    strict, at = run(tmp_path, "fifo")
    easy, _ = run(tmp_path, "easy-backfill")
    assert strict.start[at["small"]] == 110  # behind the 2-GPU head
    assert easy.start[at["small"]] == 2  # ends at 52, before the head's reservation at 100
    assert easy.start[at["wide"]] == 100  # not delayed by it


def test_backfill_never_delays_the_head(tmp_path: Path) -> None:
    pods = [
        ("a", 1, "LS", 0, 0, 100),
        ("wide", 2, "LS", 1, 1, 11),
        ("slow", 1, "LS", 2, 2, 502),
        ("z", 0, "LS", 9000, 9000, 9001),
    ]
    write_trace(tmp_path, pods, gpus=2)
    easy, at = run(tmp_path, "easy-backfill")
    assert easy.start[at["wide"]] == 100 and easy.start[at["slow"]] == 110


def test_a_latency_sensitive_pod_preempts_a_best_effort_one_after_the_grace(tmp_path: Path) -> None:
    pods = [("be", 1, "BE", 0, 0, 1000), ("ls", 1, "LS", 10, 10, 60), ("z", 0, "LS", 9000, 9000, 9001)]
    write_trace(tmp_path, pods)
    result, at = run(tmp_path, "fair-share")
    assert result.start[at["ls"]] == 40  # 10 + the 30 s grace
    assert result.preempted[at["be"]] == 1 and result.record()["preemptions"] == 1
    assert result.end[at["be"]] == 90 + 1000  # requeued, started again when ls ended, ran its whole duration


def test_load_compresses_arrivals_and_keeps_durations(tmp_path: Path) -> None:
    write_trace(
        tmp_path,
        [("a", 1, "LS", 0, 0, 100), ("b", 1, "LS", 1000, 1000, 1100), ("z", 0, "LS", 9000, 9000, 9001)],
    )
    result, at = run(tmp_path, "fifo", load=20.0)
    assert result.arrival[at["b"]] == 50 and result.start[at["b"]] == 100  # waits for a's 100 s


def test_pods_never_scheduled_are_left_out_and_counted(tmp_path: Path) -> None:
    write_trace(tmp_path, [("a", 1, "LS", 0, 0, 100), ("z", 0, "LS", 9000, 9000, 9001)])
    with (tmp_path / "openb_pod_list_t.csv").open("a") as f:
        f.write("p,1000,1024,1,1000,,BE,Pending,5,50,\n")
    trace = load_timed_trace("t", tmp_path)
    assert trace.never_scheduled == 1 and [j.name for j in trace.jobs] == ["a", "z"]
    assert trace.censored == 1  # z ends at the trace's last instant


def test_a_pod_no_node_can_hold_never_starts(tmp_path: Path) -> None:
    write_trace(
        tmp_path, [("big", 2, "LS", 0, 0, 100), ("a", 1, "LS", 1, 1, 10), ("z", 0, "LS", 9000, 9000, 9001)]
    )
    result, at = run(tmp_path, "fifo")
    assert result.never_fits[at["big"]] and np.isnan(result.start[at["big"]])
    assert result.start[at["a"]] == 1  # a strict queue is not blocked by it
    assert result.record()["never_started"] == 1


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("b,1000,1024,1,1000,,LS,Running,1,5,8", "negative duration"),
        ("b,1000,1024,1,1000,,LS,Running,10,50,8", "negative wait"),
        ("b,1000,1024,1,1000,,LS,Running,nan,50,8", "finite"),
        ("b,1000,1024,1,1000,,LS,Running,,50,8", "creation_time is empty"),
    ],
)
def test_bad_time_cells_are_trace_format_errors(tmp_path: Path, row: str, message: str) -> None:
    write_trace(tmp_path, [("a", 1, "LS", 0, 0, 100)])
    with (tmp_path / "openb_pod_list_t.csv").open("a") as f:
        f.write(row + "\n")
    with pytest.raises(TraceFormatError, match=message):
        load_timed_trace("t", tmp_path)


def test_a_trace_without_timestamps_is_refused(tmp_path: Path) -> None:
    write_trace(tmp_path, [])
    (tmp_path / "openb_pod_list_t.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,1,1000\n"
    )
    with pytest.raises(TraceFormatError, match="no timestamps"):
        load_timed_trace("t", tmp_path)


def test_repeating_a_trace_shifts_each_copy_by_its_length(tmp_path: Path) -> None:
    write_trace(tmp_path, [("a", 1, "LS", 0, 0, 100), ("z", 0, "LS", 900, 900, 901)])
    trace = load_timed_trace("t", tmp_path)
    twice = repeat_trace(trace, 2)
    assert [j.arrival for j in twice.jobs] == [0, 900, 902, 1802]
    assert len(twice.jobs) == 2 * len(trace.jobs)


def test_the_bundled_trace_replays_with_fgd_and_fair_share() -> None:
    trace = load_timed_trace()
    chosen = queue_setup("fair-share")
    result = replay_timed(
        trace, ReplayConfig("fgd", chosen.queue, chosen.backfill, 3000.0, label="fair-share")
    )
    record = result.record()
    assert record["pods"] == len(trace.jobs) == 8152 - trace.never_scheduled
    assert record["finished"] + record["censored"] + record["never_started"] >= record["pods"]
    assert record["policy_fallbacks"] == {}
    assert 0 < record["mean_allocation_pct"] < 100
    result_ledger_free = result.allocated_gpu_milli[-1]
    assert result_ledger_free == 0  # every pod ended and gave its GPUs back


def _gpu_sets(tmp_path: Path, pods: list[tuple], topology: str | None) -> dict[str, tuple[int, ...]]:
    """The GPUs each pod started on, in a replay of ``pods`` on one 8-GPU node wired as ``topology``."""
    from gpuslice.sim.timed_replay import _Replay

    write_trace(tmp_path, pods, gpus=8)
    trace = load_timed_trace("t", tmp_path)
    replay = _Replay(trace, ReplayConfig("bestfit", "fifo", True, topology=topology), None)
    got: dict[str, tuple[int, ...]] = {}
    start = replay._start

    def record(index, job, placement, now):
        got[trace.jobs[index].name] = placement.gpus
        start(index, job, placement, now)

    replay._start = record  # type: ignore[method-assign]
    replay.run(None)
    return got


def test_multi_gpu_pods_arriving_together_get_their_sets_jointly(tmp_path: Path) -> None:
    # six 1-GPU pods take GPUs 0–5 (best fit, lowest first); those on 3 and 4 end at 50, so GPUs 0, 1, 2
    # and 5 are busy when two 2-GPU pods arrive, on a DGX-1 V100
    ones = [(f"p{i}", 1, "LS", i, i, 50 if i in (3, 4) else 10000) for i in range(6)]
    end = [("z", 0, "LS", 20000, 20000, 20001)]
    a = ("a", 2, "LS", 100, 100, 5000)
    together = _gpu_sets(tmp_path, [*ones, a, ("b", 2, "LS", 100, 100, 5000), *end], "dgx1-v100")
    assert (together["a"], together["b"]) == ((4, 6), (3, 7))  # two NVLink pairs
    apart = _gpu_sets(tmp_path, [*ones, a, ("b", 2, "LS", 101, 101, 5000), *end], "dgx1-v100")
    assert (apart["a"], apart["b"]) == ((4, 7), (3, 6))  # one at a time: the NV2 pair, then PCIe only
    plain = _gpu_sets(tmp_path, [*ones, a, ("b", 2, "LS", 100, 100, 5000), *end], None)
    assert (plain["a"], plain["b"]) == ((3, 4), (6, 7))  # no wiring: the lowest free GPUs, no batch


def test_allocation_over_the_busy_window_leaves_out_the_tail_one_long_pod_makes(tmp_path: Path) -> None:
    """Two GPUs. 100 pods hold one GPU each for 10 s, one after another (0–1,000 s); one more pod holds
    the other GPU from 0 to 100,000 s. Over the makespan the cluster is ~25 % allocated; over the busy
    window (the first event until 99 % of the 101 finished pods had ended: the 100th, at 1,000 s) it is
    100 %. (The censored tail pod is not a finished pod.)"""
    pods = [(f"p{i}", 1, "LS", 10 * i, 10 * i, 10 * i + 10) for i in range(100)]
    pods.append(("long", 1, "LS", 0, 0, 100_000))
    pods.append(("tail", 0, "LS", 200_000, 200_000, 200_001))  # censored: keeps "long" uncensored
    write_trace(tmp_path, pods, gpus=2)
    result, _ = run(tmp_path, "fifo")
    record = result.record()
    assert record["mean_allocation_pct"] == pytest.approx(100 * (1_000 + 100_000) / 200_000 / 2, abs=0.01)
    start, end = record["busy_window_s"]
    assert start == 0 and end == 1_000
    assert record["busy_allocation_pct"] == pytest.approx(100.0)
