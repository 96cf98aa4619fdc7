"""workload.target: FGD's target workload — popular shapes covering 95 % of tasks."""

from __future__ import annotations

import numpy as np
import pytest

from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

A = Request(cpu_milli=4000, num_gpu=1, gpu_milli=500)
B = Request(cpu_milli=8000, num_gpu=1, gpu_milli=1000)
C = Request(cpu_milli=2000)  # CPU-only
D = Request(cpu_milli=16000, num_gpu=2, gpu_milli=1000)
E = Request(cpu_milli=1000, num_gpu=1, gpu_milli=200)


def test_shapes_are_kept_most_popular_first_until_they_cover_95_percent() -> None:
    # counts 60, 30, 6, 3, 1: cumulative 60 %, 90 %, 96 % -> D and E are cut
    tasks = [A] * 60 + [B] * 30 + [C] * 6 + [D] * 3 + [E]
    target = TargetWorkload.from_requests(tasks)
    assert target.shapes == (A, B, C)
    np.testing.assert_allclose(target.probability, [60 / 96, 30 / 96, 6 / 96])


def test_the_shape_that_crosses_the_threshold_is_kept() -> None:
    # 94 % after A and B, so C (the one that crosses 95 %) stays and D goes
    tasks = [A] * 50 + [B] * 44 + [C] * 4 + [D] * 2
    assert TargetWorkload.from_requests(tasks).shapes == (A, B, C)


def test_a_lower_coverage_keeps_fewer_shapes() -> None:
    tasks = [A] * 60 + [B] * 30 + [C] * 10
    assert TargetWorkload.from_requests(tasks, coverage=0.5).shapes == (A,)


def test_memory_is_not_part_of_a_shape() -> None:
    tasks = [
        Request(cpu_milli=4000, memory_bytes=1, num_gpu=1, gpu_milli=500),
        Request(cpu_milli=4000, memory_bytes=2**30, num_gpu=1, gpu_milli=500),
    ]
    target = TargetWorkload.from_requests(tasks)
    assert target.shapes == (Request(cpu_milli=4000, memory_bytes=0, num_gpu=1, gpu_milli=500),)
    np.testing.assert_allclose(target.probability, [1.0])


def test_gpu_models_are_part_of_a_shape() -> None:
    pinned = Request(cpu_milli=4000, num_gpu=1, gpu_milli=500, gpu_models=("T4",))
    assert len(TargetWorkload.from_requests([A, pinned])) == 2


def test_cpu_only_shapes_are_included_by_default_and_can_be_left_out() -> None:
    tasks = [A] * 3 + [C] * 2
    assert C in TargetWorkload.from_requests(tasks).shapes
    without = TargetWorkload.from_requests(tasks, include_cpu_only=False)
    assert without.shapes == (A,)
    np.testing.assert_allclose(without.probability, [1.0])


@pytest.mark.parametrize(
    "tasks",
    [[A], [A, B], [A] * 7 + [B] * 3 + [C] * 5 + [D] + [E] * 2, [A] * 60 + [B] * 30 + [C] * 6 + [D] * 3 + [E]],
)
def test_probabilities_are_positive_and_sum_to_one(tasks: list[Request]) -> None:
    target = TargetWorkload.from_requests(tasks)
    assert target.probability.sum() == pytest.approx(1.0)
    assert (target.probability > 0).all()
    assert len(target.probability) == len(target.shapes)


def test_cpu_only_share_is_the_probability_of_cpu_only_shapes() -> None:
    tasks = [A] * 6 + [C] * 3 + [Request(cpu_milli=500)] * 1
    assert TargetWorkload.from_requests(tasks).cpu_only_share == pytest.approx(0.4)
    assert TargetWorkload.from_requests([A, B]).cpu_only_share == 0.0


def test_equal_counts_are_ordered_by_shape_so_the_cut_is_deterministic() -> None:
    # every shape equally often: ordered by CPU (four shapes cover only 80 %, so all five stay)
    tasks = [E, D, C, B, A] * 4
    target = TargetWorkload.from_requests(tasks)
    assert target.shapes == (E, C, A, B, D)
    assert TargetWorkload.from_requests(list(reversed(tasks))).shapes == target.shapes


def test_a_target_needs_at_least_one_task() -> None:
    with pytest.raises(ValueError, match="at least one task"):
        TargetWorkload.from_requests([])
    with pytest.raises(ValueError, match="at least one task"):
        TargetWorkload.from_requests([C], include_cpu_only=False)
