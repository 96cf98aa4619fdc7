"""Hungarian batch assignment: optimal over every assignment, each cost term steers, clear refusals."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.errors import UserError
from gpuslice.hardware.topology_profiles import profile
from gpuslice.scheduler.batch_assign import (
    AssignWeights,
    BatchTask,
    ImpossibleBatch,
    assign_batch,
    cost_matrix,
)

DGX1 = profile("dgx1-v100")
L4 = profile("pcie-4x-l4")


def test_empty_batch_assigns_nothing():
    assert assign_batch(DGX1, []).gpus == ()


def test_a_task_lands_next_to_its_peer_on_the_widest_link():
    # Peer on GPU0, which is busy: GPU3 and GPU4 reach it over NV2 (50 GB/s); the others NV1 or SYS.
    tasks = [BatchTask("rank1", peers=(0,), bandwidth_gbps=20.0)]
    load = [1, 0, 0, 0, 0, 0, 0, 0]
    assert assign_batch(DGX1, tasks, gpu_load=load).gpus[0] in (3, 4)
    # Without the load term, sharing the peer's own GPU is cheapest: no link at all.
    assert assign_batch(DGX1, tasks, gpu_load=load, weights=AssignWeights(gamma=0)).gpus == (0,)


def test_load_imbalance_alone_spreads_tasks_to_idle_gpus():
    tasks = [BatchTask(f"t{i}") for i in range(2)]
    out = assign_batch(L4, tasks, gpu_load=[1.0, 0.0, 1.0, 0.0], weights=AssignWeights(0, 0, 1))
    assert sorted(out.gpus) == [1, 3]


@settings(max_examples=40, deadline=None)
@given(
    n_tasks=st.integers(1, 4),
    peers=st.lists(st.sets(st.integers(0, 3), max_size=2), min_size=4, max_size=4),
    rates=st.lists(st.floats(0, 40), min_size=4, max_size=4),
    load=st.lists(st.floats(0, 2), min_size=4, max_size=4),
    weights=st.tuples(st.floats(0, 3), st.floats(0, 3), st.floats(0, 3)),
)
def test_the_assignment_is_the_cheapest_of_all_assignments(n_tasks, peers, rates, load, weights):
    tasks = [
        BatchTask(f"t{i}", peers=tuple(sorted(peers[i])), bandwidth_gbps=rates[i]) for i in range(n_tasks)
    ]
    w = AssignWeights(*weights)
    out = assign_batch(L4, tasks, gpu_load=load, weights=w)
    cost = cost_matrix(L4, tasks, gpu_load=load, weights=w)
    brute = min(sum(cost[t, g] for t, g in enumerate(p)) for p in permutations(range(4), n_tasks))
    assert out.total_cost == pytest.approx(brute)
    assert len(set(out.gpus)) == n_tasks


def test_slots_let_a_gpu_take_several_tasks_filling_the_emptiest_first():
    tasks = [BatchTask(f"t{i}") for i in range(6)]
    out = assign_batch(L4, tasks, slots_per_gpu=2)
    counts = np.bincount(out.gpus, minlength=4)
    assert counts.max() <= 2 and counts.sum() == 6


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tasks": [BatchTask(f"t{i}") for i in range(5)]}, "5 tasks but pcie-4x-l4 has 4 GPUs"),
        (
            {"tasks": [BatchTask("a", allowed=(1,)), BatchTask("b", allowed=(1,))]},
            "no assignment .*'a' → \\[1\\]",
        ),
        ({"tasks": [BatchTask("a", peers=(7,))]}, "task 'a' names GPU 7"),
        ({"tasks": [BatchTask("a", allowed=())]}, "allows no GPU"),
        ({"tasks": [BatchTask("a")], "weights": AssignWeights(alpha=-1)}, "weight alpha=-1"),
        ({"tasks": [BatchTask("a")], "gpu_load": [0, 0]}, "gpu_load needs 4"),
        ({"tasks": [BatchTask("a", bandwidth_gbps=float("nan"))]}, "must be finite"),
        ({"tasks": [BatchTask("a")], "slots_per_gpu": 0}, "at least 1 task"),
    ],
    ids=[
        "too many tasks",
        "allowed sets clash",
        "unknown peer",
        "empty allowed",
        "negative weight",
        "short load",
        "nan rate",
        "zero slots",
    ],
)
def test_impossible_batches_are_user_errors_that_say_why(kwargs, match):
    with pytest.raises(ImpossibleBatch, match=match) as info:
        assign_batch(L4, **kwargs)
    assert isinstance(info.value, UserError)


def test_forbidden_gpus_cost_infinity_and_are_never_used():
    tasks = [BatchTask("a", allowed=(2, 3)), BatchTask("b")]
    cost = cost_matrix(L4, tasks)
    assert np.isinf(cost[0, [0, 1]]).all() and np.isfinite(cost[1]).all()
    assert assign_batch(L4, tasks).gpus[0] in (2, 3)
