"""Batch assignment of GPU sets: never a GPU twice, the optimum of a brute force over the same candidates,
every job started when a joint assignment of all exists, and a reason for each job left waiting."""

from __future__ import annotations

import itertools
import random

import pytest

from gpuslice.hardware.topology_profiles import profile
from gpuslice.policies.gpuset.batch import (
    BatchJob,
    CostWeights,
    assign_batch,
    candidate_sets,
    set_cost,
)
from gpuslice.policies.gpuset.pick import pick_gpu_set
from gpuslice.workload.job import TopologyNeed

MACHINES = ("dgx1-v100", "pcie-8gpu-2socket", "dgx-a100", "pcie-4x-l4")


def brute_force(topo, free, jobs):
    """The best key (jobs waiting, Σ over waiting jobs of n − position, total cost) over every way to
    give each job one of its sets or nothing, the sets disjoint."""
    n = len(jobs)
    options = [[None, *candidate_sets(topo, free, job, None)] for job in jobs]
    best = None
    for combo in itertools.product(*options):
        used = [g for s in combo if s is not None for g in s]
        if len(used) != len(set(used)):
            continue
        waiting = [j for j, s in enumerate(combo) if s is None]
        cost = sum(set_cost(topo, free, s, CostWeights()).total for s in combo if s is not None)
        key = (len(waiting), sum(n - j for j in waiting), round(cost, 6))
        best = key if best is None or key < best else best
    return best


def key_of(result):
    n = len(result.jobs)
    waiting = [j for j, s in enumerate(result.sets) if s is None]
    return (len(waiting), sum(n - j for j in waiting), round(result.total, 6))


def random_case(rng: random.Random):
    topo = profile(rng.choice(MACHINES))
    free = sorted(rng.sample(range(topo.n_gpus), rng.randint(2, topo.n_gpus)))
    jobs = []
    for i in range(rng.randint(1, 3)):
        need = rng.choice([TopologyNeed.ANY, TopologyNeed.ANY, TopologyNeed.NVLINK, TopologyNeed.PCIE_SWITCH])
        eligible = None if rng.random() < 0.7 else tuple(sorted(rng.sample(free, rng.randint(1, len(free)))))
        jobs.append(BatchJob(f"j{i}", rng.choice([1, 2, 2, 3, 4]), need, eligible))
    return topo, free, jobs


@pytest.mark.parametrize("seed", range(60))
def test_equals_brute_force_and_never_gives_a_gpu_twice(seed):
    topo, free, jobs = random_case(random.Random(seed))
    result = assign_batch(topo, free, jobs, top_n=None)
    given = [g for s in result.sets if s is not None for g in s.gpus]
    assert len(given) == len(set(given)), "a GPU was given twice"
    assert set(given) <= set(free)
    for job, s in zip(jobs, result.sets, strict=True):
        if s is not None:
            assert len(s.gpus) == job.k and (job.eligible is None or set(s.gpus) <= set(job.eligible))
            assert s.gpus in candidate_sets(topo, free, job, None)
        else:
            assert result.reasons[job.name]
    assert result.optimal
    assert key_of(result) == brute_force(topo, free, jobs)


@pytest.mark.parametrize("seed", range(30))
def test_the_candidate_cut_never_leaves_a_job_waiting_that_could_start(seed):
    topo, free, jobs = random_case(random.Random(1000 + seed))
    cut = assign_batch(topo, free, jobs, top_n=1)
    full = assign_batch(topo, free, jobs, top_n=None)
    assert sum(s is None for s in cut.sets) == sum(s is None for s in full.sets)


def test_two_pairs_on_a_dgx1_both_get_nvlink_where_one_at_a_time_leaves_pcie():
    topo = profile("dgx1-v100")
    free = [3, 4, 6, 7]  # GPUs 0, 1, 2, 5 are busy
    result = assign_batch(topo, free, [BatchJob("a", 2), BatchJob("b", 2)])
    sets = [s.gpus for s in result.sets]
    assert sorted(sets) == [(3, 7), (4, 6)]
    assert all(topo.nvlinks[s[0], s[1]] > 0 for s in sets)
    first = pick_gpu_set(topo, free, 2)  # one at a time: the NV2 pair first, then what is left
    second = pick_gpu_set(topo, set(free) - set(first), 2)
    assert first == (4, 7) and topo.nvlinks[second[0], second[1]] == 0


def test_a_job_that_cannot_start_waits_with_a_reason_and_the_rest_start():
    topo = profile("dgx1-v100")
    jobs = [BatchJob("big", 4), BatchJob("nv", 2, TopologyNeed.NVLINK), BatchJob("late", 4)]
    result = assign_batch(topo, [0, 1, 2, 3, 4, 6], jobs)
    assert result.gpus_of("late") is None and result.gpus_of("big") and result.gpus_of("nv")
    assert "overlaps GPUs given to other jobs" in result.reasons["late"]
    alone = assign_batch(topo, [0, 5], [BatchJob("nv", 2, TopologyNeed.NVLINK), BatchJob("x", 3)])
    assert alone.sets == (None, None)
    assert "topology nvlink" in alone.reasons["nv"] and "only 2 free" in alone.reasons["x"]


def test_earlier_jobs_start_first_when_not_all_fit():
    topo = profile("dgx-a100")
    result = assign_batch(topo, range(4), [BatchJob("first", 4), BatchJob("second", 4)])
    assert result.gpus_of("first") == (0, 1, 2, 3) and result.gpus_of("second") is None


def test_cost_terms_follow_the_weights():
    topo = profile("dgx1-v100")
    cost = set_cost(topo, range(8), (0, 3), CostWeights(alpha=1, beta=0, gamma=0))
    assert (cost.latency, cost.bandwidth, cost.total) == (1.0, 1.0, 1.0)  # NV2: the best pair
    pcie = set_cost(topo, range(8), (0, 5), CostWeights(alpha=0, beta=1, gamma=0))
    assert pcie.latency == 3.0 and pcie.total == pytest.approx(50 / (15.75 * 0.4))
    assert set_cost(topo, range(8), (0, 1, 2, 3), CostWeights(0, 0, 1)).balance == 4.0
