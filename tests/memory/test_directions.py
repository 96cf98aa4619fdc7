"""Directions of gpu_ext's findings (research §4.1, §2.2), as issue 5's acceptance asks.

Two of three do not reproduce in this model; they are strict xfails that say why, so a model change
that makes them pass is noticed.
"""

from __future__ import annotations

import pytest

from gpuslice.memory.policies import make_ops
from gpuslice.memory.simulator import SimConfig, simulate
from gpuslice.memory.workloads import make_workload


@pytest.mark.parametrize("workload", ["mix-hotspot", "mix-gemm", "mix-decode-gnn"])
def test_priority_policy_cuts_the_high_priority_tenants_time(workload):
    trace = make_workload(workload, scale=0.3)
    cfg = SimConfig(oversub=1.5)
    base = simulate(trace, make_ops("default", "tree"), cfg)
    prio = simulate(trace, make_ops("priority", "priority"), cfg)
    assert prio.tenant_seconds[0] < base.tenant_seconds[0]


@pytest.mark.xfail(
    strict=True,
    reason="rand-stream thrashes at 1.2x: the native tree falls back to 4 KB demand faults (thrashing "
    "pages excluded) while always-max moves 2 MB per fault that is evicted before reuse; our cost model "
    "charges bytes and a per-batch overhead, not a per-fault cost, so demand paging is cheaper here",
)
def test_always_max_beats_the_driver_on_the_random_stream_at_1_2x():
    trace = make_workload("rand-stream", scale=0.25)
    cfg = SimConfig(oversub=1.2)
    base = simulate(trace, make_ops("default", "tree"), cfg)
    assert simulate(trace, make_ops("default", "always-max"), cfg).estimated_seconds < base.estimated_seconds


def test_lfu_beats_the_driver_on_moe_decode_at_1_8x():
    trace = make_workload("llm-moe-decode", scale=0.5)
    cfg = SimConfig(oversub=1.8)
    base = simulate(trace, make_ops("default", "tree"), cfg)
    assert simulate(trace, make_ops("lfu", "tree"), cfg).estimated_seconds < base.estimated_seconds


@pytest.mark.xfail(
    strict=True,
    reason="stride's 2-page window with no prefetch on a block's first fault cannot match the tree's "
    "64 KB growth on decode's dense per-expert sweeps; only the LFU half reproduces (test above)",
)
def test_stride_with_lfu_beats_the_driver_on_moe_decode_at_1_8x():
    trace = make_workload("llm-moe-decode", scale=0.5)
    cfg = SimConfig(oversub=1.8)
    base = simulate(trace, make_ops("default", "tree"), cfg)
    assert simulate(trace, make_ops("lfu", "stride"), cfg).estimated_seconds < base.estimated_seconds
