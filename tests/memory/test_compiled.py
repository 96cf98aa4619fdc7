"""The compiled replay of the driver's own policies gives exactly the general (hook) path's results."""

from __future__ import annotations

import pytest

from gpuslice.memory.cost import CostModel
from gpuslice.memory.hooks import MemoryOps
from gpuslice.memory.policies import make_ops
from gpuslice.memory.simulator import SimConfig, _Run, simulate
from gpuslice.memory.workloads import WORKLOADS, make_workload

CONFIGS = {
    "1.5x": SimConfig(oversub=1.5),
    "1.2x-preferred-gpu": SimConfig(oversub=1.2, preferred_gpu=True),  # whole block on first touch
    "1.8x-pcie5": SimConfig(oversub=1.8, cost=CostModel(link="pcie5")),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_compiled_driver_default_equals_the_general_path_on_every_workload(workload, config):
    trace = make_workload(workload, scale=0.1)
    cfg = CONFIGS[config]
    fast = simulate(trace, make_ops("default", "tree"), cfg).as_dict()
    general = simulate(trace, make_ops("default", "tree"), cfg, compiled=False).as_dict()
    fast.pop("wall_seconds"), general.pop("wall_seconds")
    assert fast == general  # every counter, bytes, thrashing events, estimated and per-tenant seconds


def test_progress_reports_every_access_once_on_the_compiled_path():
    trace = make_workload("hotspot", scale=0.5)  # > 64 k accesses: several compiled slices
    seen: list[int] = []
    simulate(trace, make_ops("default", "tree"), SimConfig(), progress=seen.append)
    assert len(seen) > 1 and sum(seen) == len(trace)


def test_only_the_drivers_own_behaviour_is_compiled():
    trace = make_workload("gemm", scale=0.05)

    def compilable(ops, **cfg) -> bool:
        return _Run(trace, ops, SimConfig(**cfg)).compilable()

    assert compilable(make_ops("default", "tree")) and compilable(MemoryOps())
    assert not compilable(make_ops("lfu", "tree"))  # block_activate requests HEAD
    assert not compilable(make_ops("default", "always-max"))  # page_prefetch returns BYPASS
    assert not compilable(make_ops("belady", "tree"))  # evict_prepare moves the victim
    assert not compilable(make_ops("default", "tree"), visibility="full")  # access hook moves chunks
