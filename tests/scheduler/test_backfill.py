"""EASY backfill's reservation (``scheduler/backfill.py``): what a backfilled job takes stays taken."""

from __future__ import annotations

import math

from gpuslice.scheduler.backfill import Shadow, allows, shadow
from gpuslice.scheduler.node_fit import Capacity, Holding

GiB = 2**30


def capacity(free_milli: list[int]) -> Capacity:
    n = len(free_milli)
    return Capacity(free_milli, [80 * GiB] * n, [None] * n, [0] * n, [80 * GiB] * n)


def head_needs_two_whole_gpus(cap: Capacity) -> bool:
    return int((cap.free_milli == 1000).sum()) >= 2


def test_two_backfilled_jobs_cannot_together_delay_the_head() -> None:
    """Four GPUs, one busy until t=100; the head needs two whole GPUs, so its shadow at t=100 has four
    free. One long job on one GPU leaves three (the head still fits); a second leaves two; a third would
    leave one: refused. Without the reservation keeping what each took, all three would pass."""
    now = capacity([1000, 1000, 1000, 0])
    reservation = shadow(now, [(100.0, Holding((3,), milli=1000))], head_needs_two_whole_gpus)
    assert reservation is not None and reservation.time == 100.0
    long = math.inf  # no max_runtime: never ends, so only the capacity rule can let it in
    assert allows(reservation, Holding((0,), milli=1000), long, head_needs_two_whole_gpus)
    assert allows(reservation, Holding((1,), milli=1000), long, head_needs_two_whole_gpus)
    assert not allows(reservation, Holding((2,), milli=1000), long, head_needs_two_whole_gpus)
    assert reservation.capacity.free_milli.tolist() == [0, 0, 1000, 1000]


def test_a_job_that_ends_before_the_shadow_backfills_without_taking_from_it() -> None:
    reservation = Shadow(100.0, capacity([1000, 1000]))
    assert allows(reservation, Holding((0,), milli=1000), 50.0, head_needs_two_whole_gpus)
    assert reservation.capacity.free_milli.tolist() == [1000, 1000]
    assert not allows(reservation, Holding((0,), milli=1000), 150.0, head_needs_two_whole_gpus)


def test_the_shadow_gives_back_the_earliest_ending_job_first_and_ties_do_not_compare_holdings() -> None:
    """Two GPUs busy, ending at t=200 (GPU 0) and t=100 (GPU 1), listed latest first; the head needs one
    whole GPU more than the one free: its shadow is t=100, when GPU 1 comes back. Two jobs ending at the
    same time are given back in the order they started, never by comparing what they hold."""
    now = capacity([0, 0, 1000])
    running = [(200.0, Holding((0,), milli=1000)), (100.0, Holding((1,), milli=1000))]
    reservation = shadow(now, running, head_needs_two_whole_gpus)
    assert reservation is not None and reservation.time == 100.0
    assert reservation.capacity.free_milli.tolist() == [0, 1000, 1000]
    tied = [(100.0, Holding((0,), milli=1000)), (100.0, Holding((1,), milli=1000))]
    assert shadow(capacity([0, 0, 0]), tied, head_needs_two_whole_gpus).time == 100.0  # type: ignore[union-attr]


def test_without_a_reservation_anything_backfills_and_a_job_ending_at_the_shadow_does_too() -> None:
    assert allows(None, Holding((0,), milli=1000), math.inf, head_needs_two_whole_gpus)
    reservation = Shadow(100.0, capacity([1000, 1000]))
    assert allows(reservation, Holding((0,), milli=1000), 100.0, head_needs_two_whole_gpus)  # ends at it
    assert reservation.capacity.free_milli.tolist() == [1000, 1000]
