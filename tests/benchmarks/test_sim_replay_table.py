"""The timed-replay table's offered load, its per-copy run-time estimates and its ordering check
(``benchmarks/offered_load.py``, ``sim_replay_table.py``, ``render_replay_table.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpuslice.hardware.node import NodeSpec
from gpuslice.sim.queue_setups import queue_setup
from gpuslice.sim.timed_trace import TimedJob, TimedTrace, repeat_trace
from gpuslice.sim.tune import tuning_trace
from gpuslice.workload.request import Request
from offered_load import compression_for, peak_gpus
from render_replay_table import ordering, render
from sim_replay_table import copy_estimates

GIB = 2**30


def job(name: str, arrival: float, duration: float, num_gpu: int, milli: int = 1000) -> TimedJob:
    request = Request(cpu_milli=1000, memory_bytes=GIB, num_gpu=num_gpu, gpu_milli=milli)
    return TimedJob(name, request, "LS", arrival, duration, 0.0, False)


def trace(*jobs: TimedJob, gpus: int = 4) -> TimedTrace:
    node = NodeSpec("n0", 64_000, 256 * GIB, gpus, "V100M16")
    return TimedTrace("t", (node,), jobs, max(j.arrival + j.duration for j in jobs), 0)


def test_peak_counts_a_share_as_its_fraction_and_an_end_before_a_start_at_the_same_instant():
    t = trace(job("a", 0, 10, 1), job("b", 10, 5, 1, milli=500), job("c", 0, 20, 2))
    assert peak_gpus(t, 1.0) == 3.0  # b starts as a ends: 2.5 then, not 3.5
    assert peak_gpus(t, 2.0) == 3.5  # b now arrives at 5, while a and c still run


def test_compression_takes_the_fewest_copies_and_the_least_load_that_reach_the_ratio():
    # one copy asks for 3 of 4 GPUs at most (a and c together), so 1.5 needs two copies
    t = trace(job("a", 0, 10, 1), job("b", 100, 5, 1, milli=500), job("c", 0, 20, 2))
    copies, load, reached = compression_for(t, 1.5)
    assert copies == 2 and reached >= 1.5
    played = repeat_trace(t, copies)
    assert peak_gpus(played, load * 0.99) / 4 < 1.5  # a little less compression falls short
    copies, _, reached = compression_for(t, 0.5)
    assert copies == 1 and reached >= 0.5
    with pytest.raises(ValueError, match="offer less"):
        compression_for(t, 100.0)


def test_every_copy_of_a_pod_declares_the_estimate_of_one_copy():
    base = tuning_trace("default@1", 120, 10)
    estimates = copy_estimates(base.jobs, queue_setup("sjf-predicted"), 3)
    assert len(estimates) == len(repeat_trace(base, 3).jobs)
    first, second, third = np.split(estimates, 3)
    assert np.array_equal(first, second) and np.array_equal(first, third)
    assert not np.array_equal(first, [j.duration for j in base.jobs])  # predicted, not the oracle


@pytest.mark.parametrize(
    ("means", "verdict"),
    [
        ((1.0, 2.0, 3.0), "holds"),
        ((5.0, 5.0, 5.0), "tie (no queue)"),
        ((1.0, 3.0, 2.0), "differs: predicted ≥ FIFO"),
        ((2.0, 1.0, 3.0), "differs: oracle ≥ predicted"),
        ((1.0, 1.0, 2.0), "differs: oracle = predicted"),
    ],
)
def test_ordering_names_which_inequality_fails(means, verdict):
    assert ordering(*means) == verdict


def test_render_counts_the_orderings_that_hold_and_marks_missing_runs():
    level = {"kind": "level", "trace": "t", "level": "heavy", "repeat": 2, "base_pods": 10, "nodes": 1,
             "cluster_gpus": 4, "load": 100.0, "peak_gpus": 8.0, "offered": 2.0}  # fmt: skip
    runs = {}
    for placement, jcts in (("fgd", (1.0, 2.0, 3.0)), ("bestfit", (2.0, 1.0, 3.0))):
        for queue, jct in zip(("sjf-oracle", "sjf-predicted", "fifo"), jcts, strict=True):
            runs[(queue, placement)] = {"trace": "t", "level": "heavy", "queue": queue,
                                        "placement": placement, "jct_mean": jct, "jct_p99": jct,
                                        "wait_mean": 0.0, "wait_p99": 0.0, "preemptions": 0,
                                        "never_started": 0}  # fmt: skip
    text = render(runs, {("t", "heavy"): level}, None)
    assert "holds in **1 of 2**" in text
    assert "| t | heavy | easy-backfill | not run |" in text
    assert "| t | heavy | 2 × 10 | 1 (4) | 100 | 8 | 2.00 |" in text
