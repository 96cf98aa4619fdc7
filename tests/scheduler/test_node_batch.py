"""Serve's pass assigns waiting multi-GPU jobs together: two 2-GPU jobs on a DGX-1 with GPUs 0, 1, 2, 5
busy both get an NVLink pair, where one at a time the first takes the NV2 pair and leaves the second a
PCIe-only pair; the batch's set still goes through the placer's checks."""

from __future__ import annotations

import numpy as np

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.topology_profiles import profile
from gpuslice.ledger.ledger import Ledger
from gpuslice.policies.base import PlacementOps, PolicyContext
from gpuslice.scheduler.node_scheduler import NodeScheduler, StartJob
from gpuslice.scheduler.placer import Placer
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec
from gpuslice.workload.request import Request

TOPO = profile("dgx1-v100")


def dgx1() -> Machine:
    gpus = tuple(GpuInfo(i, f"GPU-{i:04d}", "V100", 16 * GiB) for i in range(8))
    return Machine("dgx1", gpus, TOPO)


def scheduler_with_busy(busy: tuple[int, ...]) -> NodeScheduler:
    s = NodeScheduler(dgx1())
    s.adopt("busy", JobSpec(("run",), gpus=len(busy)), busy, 0.0)
    return s


def starts(decisions) -> dict[str, tuple[int, ...]]:
    return {d.job_id: d.gpus for d in decisions if isinstance(d, StartJob)}


def test_two_pairs_in_one_pass_both_get_nvlink():
    s = scheduler_with_busy((0, 1, 2, 5))
    s.submit("a", JobSpec(("run",), gpus=2), 1.0)
    s.submit("b", JobSpec(("run",), gpus=2), 2.0)
    got = starts(s.step(3.0))
    assert sorted(got.values()) == [(3, 7), (4, 6)]
    assert all(TOPO.nvlinks[g[0], g[1]] > 0 for g in got.values())


def test_one_at_a_time_the_second_pair_gets_pcie():
    s = scheduler_with_busy((0, 1, 2, 5))
    s.submit("a", JobSpec(("run",), gpus=2), 1.0)
    first = starts(s.step(2.0))
    s.submit("b", JobSpec(("run",), gpus=2), 3.0)
    second = starts(s.step(4.0))
    assert first == {"a": (4, 7)} and second == {"b": (3, 6)}
    assert TOPO.nvlinks[3, 6] == 0


class _Lowest(PlacementOps):
    """Advises the lowest free GPUs for every request: its advice comes before the batch's set."""

    def pick_gpus(self, view, req, node):
        free = np.flatnonzero(view.free_gpu_milli[node] >= 1000)
        return tuple(int(g) for g in free[: req.num_gpu])


def test_the_placement_policy_advice_still_comes_first():
    s = NodeScheduler(dgx1(), placement=_Lowest)
    s.adopt("busy", JobSpec(("run",), gpus=4), (0, 1, 2, 5), 0.0)
    s.submit("a", JobSpec(("run",), gpus=2), 1.0)
    s.submit("b", JobSpec(("run",), gpus=2), 2.0)
    assert starts(s.step(3.0)) == {"a": (3, 4), "b": (6, 7)}


def test_a_batch_set_the_ledger_refuses_falls_back_to_the_default_and_is_counted():
    from gpuslice.hardware.node import NodeSpec

    ledger = Ledger([NodeSpec("dgx", 96_000, 512 * GiB, 8, "V100", 16 * GiB)])
    policy = PlacementOps(ledger.view, PolicyContext(rng=np.random.default_rng(0)))
    placer = Placer(ledger, policy, topologies=[TOPO])
    two = Request(cpu_milli=0, num_gpu=2, gpu_milli=1000)
    ledger.reserve(0, (0, 3), two)
    assert placer.pick_gpus(two, 0, topology=TOPO, batch=(2, 3)) == placer.pick_gpus(two, 0, topology=TOPO)
    assert sum(n for (src, _), n in placer.fallbacks.items() if src == "batch") == 1
    assert placer.pick_gpus(two, 0, topology=TOPO, batch=(5, 6)) == (5, 6)
    assert placer.pick_gpus(two, 0, topology=TOPO, batch=(5,)) != (5,)
