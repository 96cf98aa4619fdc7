"""policies.gpuset.pick: the one GPU-set choice the placer, the device plugin and `topo pick` share."""

from __future__ import annotations

import pytest

from gpuslice.hardware.topology_profiles import profile
from gpuslice.policies.gpuset import choose_gpu_set
from gpuslice.policies.gpuset.exact import Exact
from gpuslice.policies.gpuset.pick import meets_need, pick_gpu_set
from gpuslice.policies.gpuset.random import RandomSet
from gpuslice.workload.job import TopologyNeed


@pytest.mark.parametrize("system", ["dgx1-v100", "pcie-8gpu-2socket", "hgx-h200"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_without_constraints_the_choice_is_the_exact_policys(system: str, k: int) -> None:
    topo = profile(system)
    free = [0, 2, 3, 5, 6, 7]
    assert pick_gpu_set(topo, free, k) == choose_gpu_set(Exact(), topo, free, k).gpus


def test_a_constraint_that_every_set_meets_changes_nothing() -> None:
    topo = profile("dgx-h100")  # NVSwitch: every pair is NVLink-joined
    free = [1, 2, 4, 5, 7]
    assert pick_gpu_set(topo, free, 3, need=TopologyNeed.NVLINK) == pick_gpu_set(topo, free, 3)


def test_nvlink_need_on_a_pcie_machine_has_no_answer() -> None:
    assert pick_gpu_set(profile("pcie-8gpu-2socket"), range(8), 2, need=TopologyNeed.NVLINK) is None


def test_the_chosen_set_holds_the_must_gpus_and_meets_the_need() -> None:
    topo = profile("dgx1-v100")
    chosen = pick_gpu_set(topo, range(8), 2, need=TopologyNeed.NVLINK, must=[5])
    assert chosen is not None and 5 in chosen and meets_need(topo, chosen, TopologyNeed.NVLINK)


def test_must_gpus_that_are_not_free_or_too_many_give_none() -> None:
    topo = profile("dgx1-v100")
    assert pick_gpu_set(topo, [0, 1, 2], 2, must=[5]) is None
    assert pick_gpu_set(topo, [0, 1, 2], 1, must=[0, 1]) is None
    assert pick_gpu_set(topo, [0, 1], 3) is None


def test_without_a_topology_the_lowest_free_are_taken_must_first_and_needs_are_refused() -> None:
    assert pick_gpu_set(None, [4, 1, 6, 3], 2) == (1, 3)
    assert pick_gpu_set(None, [4, 1, 6, 3], 2, must=[6]) == (1, 6)
    assert pick_gpu_set(None, [4, 1, 6, 3], 2, need=TopologyNeed.PCIE_SWITCH) is None
    assert pick_gpu_set(None, [4, 1, 6, 3], 1, need=TopologyNeed.NVLINK) == (1,)


def test_a_gpu_set_policy_advises_only_when_there_is_no_constraint() -> None:
    topo = profile("dgx1-v100")
    free = list(range(8))
    advised = pick_gpu_set(topo, free, 3, policy=RandomSet())
    assert advised is not None and len(set(advised)) == 3
    assert pick_gpu_set(topo, free, 3, must=[0], policy=RandomSet()) == pick_gpu_set(topo, free, 3, must=[0])
