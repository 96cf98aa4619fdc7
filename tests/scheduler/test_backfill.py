"""EASY backfill's reservation (``scheduler/backfill.py``): what a backfilled job takes stays taken."""

from __future__ import annotations

import math

from gpuslice.ledger.placement import Placement
from gpuslice.ledger.whatif import NodeRow
from gpuslice.scheduler.backfill import Shadow, allows, shadow
from gpuslice.scheduler.node_fit import MachineWhatIf
from gpuslice.workload.request import Request

GiB = 2**30


def capacity(free_milli: list[int]) -> MachineWhatIf:
    n = len(free_milli)
    return MachineWhatIf(NodeRow(0, 0, tuple(free_milli), (80 * GiB,) * n, (80 * GiB,) * n))


def whole(gpu: int) -> Placement:
    """A job holding GPU ``gpu`` whole."""
    return Placement(0, (gpu,), Request(cpu_milli=0, num_gpu=1, gpu_milli=1000))


def free_milli(cap: MachineWhatIf) -> list[int]:
    return list(cap.row.gpu_milli)


def head_needs_two_whole_gpus(cap: MachineWhatIf) -> bool:
    return free_milli(cap).count(1000) >= 2


def test_two_backfilled_jobs_cannot_together_delay_the_head() -> None:
    """Four GPUs, one busy until t=100; the head needs two whole GPUs, so its shadow at t=100 has four
    free. One long job on one GPU leaves three (the head still fits); a second leaves two; a third would
    leave one: refused. Without the reservation keeping what each took, all three would pass."""
    now = capacity([1000, 1000, 1000, 0])
    reservation = shadow(now, [(100.0, whole(3))], head_needs_two_whole_gpus)
    assert reservation is not None and reservation.time == 100.0
    long = math.inf  # no max_runtime: never ends, so only the capacity rule can let it in
    assert allows(reservation, whole(0), long, head_needs_two_whole_gpus)
    assert allows(reservation, whole(1), long, head_needs_two_whole_gpus)
    assert not allows(reservation, whole(2), long, head_needs_two_whole_gpus)
    assert free_milli(reservation.capacity) == [0, 0, 1000, 1000]


def test_a_job_that_ends_before_the_shadow_backfills_without_taking_from_it() -> None:
    reservation = Shadow(100.0, capacity([1000, 1000]))
    assert allows(reservation, whole(0), 50.0, head_needs_two_whole_gpus)
    assert free_milli(reservation.capacity) == [1000, 1000]
    assert not allows(reservation, whole(0), 150.0, head_needs_two_whole_gpus)


def test_the_shadow_gives_back_the_earliest_ending_job_first_and_ties_do_not_compare_holdings() -> None:
    """Two GPUs busy, ending at t=200 (GPU 0) and t=100 (GPU 1), listed latest first; the head needs one
    whole GPU more than the one free: its shadow is t=100, when GPU 1 comes back. Two jobs ending at the
    same time are given back in the order they started, never by comparing what they hold."""
    now = capacity([0, 0, 1000])
    running = [(200.0, whole(0)), (100.0, whole(1))]
    reservation = shadow(now, running, head_needs_two_whole_gpus)
    assert reservation is not None and reservation.time == 100.0
    assert free_milli(reservation.capacity) == [0, 1000, 1000]
    tied = [(100.0, whole(0)), (100.0, whole(1))]
    assert shadow(capacity([0, 0, 0]), tied, head_needs_two_whole_gpus).time == 100.0  # type: ignore[union-attr]


def test_without_a_reservation_anything_backfills_and_a_job_ending_at_the_shadow_does_too() -> None:
    assert allows(None, whole(0), math.inf, head_needs_two_whole_gpus)
    reservation = Shadow(100.0, capacity([1000, 1000]))
    assert allows(reservation, whole(0), 100.0, head_needs_two_whole_gpus)  # ends at it
    assert free_milli(reservation.capacity) == [1000, 1000]
