"""Directions of the gpu_ext paper's findings (its evaluation and shipped prefetch policies).

Stride + LFU on MoE decode does not reproduce with the default cost model: it is a strict xfail that says
why, and the test after it pins the condition under which it does. benchmarks/out/memsim.md explains the
size and direction of each result.
"""

from __future__ import annotations

import pytest

from gpuslice.memory.cost import CostModel
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


def test_always_max_beats_the_driver_on_the_random_stream_at_1_2x():
    # per-stream progress (rand-stream carries its threads): a stream whose block arrived whole runs
    # through its tile while the others wait, which is what always-max exploits (prefetch_always_max.bpf.c)
    trace = make_workload("rand-stream", scale=0.25)
    cfg = SimConfig(oversub=1.2)
    base = simulate(trace, make_ops("default", "tree"), cfg)
    assert simulate(trace, make_ops("default", "always-max"), cfg).estimated_seconds < base.estimated_seconds


def test_in_lockstep_always_max_loses_on_the_random_stream_the_old_model():
    # the model before per-stream progress: every step waits for all its faults, so the sweep is cyclic
    # over every block and always-max moves 2 MB per 4 KB used; kept reachable and pinned here
    trace = make_workload("rand-stream", scale=0.25)
    cfg = SimConfig(oversub=1.2, stream_progress=False)
    base = simulate(trace, make_ops("default", "tree"), cfg)
    assert simulate(trace, make_ops("default", "always-max"), cfg).estimated_seconds > base.estimated_seconds


def test_lfu_beats_the_driver_on_moe_decode_at_1_8x():
    trace = make_workload("llm-moe-decode", scale=0.5)
    cfg = SimConfig(oversub=1.8)
    base = simulate(trace, make_ops("default", "tree"), cfg)
    assert simulate(trace, make_ops("lfu", "tree"), cfg).estimated_seconds < base.estimated_seconds


@pytest.mark.xfail(
    strict=True,
    reason="stride + LFU moves fewer bytes than the driver (314 vs 400 MiB in: the LFU half) but stride's "
    "2-page window without 64 KB growth needs 5024 fault batches instead of 400; at the assumed 20 us per "
    "batch (cost.py; no public source gives a service latency) that is 126.1 vs 42.1 ms at scale 0.5. It "
    "wins below ~1.8 us per batch (test below)",
)
def test_stride_with_lfu_beats_the_driver_on_moe_decode_at_1_8x():
    trace = make_workload("llm-moe-decode", scale=0.5)
    cfg = SimConfig(oversub=1.8)
    base = simulate(trace, make_ops("default", "tree"), cfg)
    assert simulate(trace, make_ops("lfu", "stride"), cfg).estimated_seconds < base.estimated_seconds


@pytest.mark.parametrize("batch_overhead_s", [0.0, 1e-6])
def test_stride_with_lfu_beats_the_driver_on_moe_decode_when_fault_batches_are_cheap(batch_overhead_s):
    # what the direction hinges on: fewer bytes (LFU keeps hot experts) against 12.6x more batches
    trace = make_workload("llm-moe-decode", scale=0.5)
    cfg = SimConfig(oversub=1.8, cost=CostModel(batch_overhead_s=batch_overhead_s))
    base = simulate(trace, make_ops("default", "tree"), cfg)
    ours = simulate(trace, make_ops("lfu", "stride"), cfg)
    assert ours.migrated_bytes < base.migrated_bytes and ours.batches > 10 * base.batches
    assert ours.estimated_seconds < base.estimated_seconds
