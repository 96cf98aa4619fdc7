"""Reason codes: the real scheduler gives each situation the code meant for it, typed where the
decision is made and never parsed from its sentence, with the amounts of the resource it lacks."""

from __future__ import annotations

import numpy as np

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.topology_profiles import profile
from gpuslice.ledger.placement import RefusalCode, Unit
from gpuslice.scheduler.node_scheduler import NodeScheduler, TenantQuota
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, Priority, TopologyNeed


def machine(n: int = 2, *, mig: bool = False, topology: str | None = None) -> Machine:
    model = profile(topology).gpu_model if topology else "H100"
    gpus = tuple(
        GpuInfo(i, f"GPU-{i}", model or "H100", 80 * GiB, mig_enabled=mig, mig_model="h100-80gb")
        for i in range(n)
    )
    return Machine("t", gpus, profile(topology) if topology else None)


def spec(**fields) -> JobSpec:
    return JobSpec(("run",), **fields)


def code_after(s: NodeScheduler, job: str, job_spec: JobSpec) -> str:
    """The code of the job's reason after one step, as the metrics label it."""
    s.submit(job, job_spec, 1.0)
    s.step(1.0)
    assert (job, s.pending_code(job)) in s.pending_codes()
    return s.pending_code(job).label


def busy(n: int = 2, **options) -> NodeScheduler:
    """A scheduler whose GPUs all hold a 60 GiB, 50 % share (not preemptible)."""
    s = NodeScheduler(machine(n), **options)
    for g in range(n):
        s.submit(f"hold{g}", spec(gpu_memory_bytes=60 * GiB, compute_percent=50, preemptible=False), 0.0)
    s.step(0.0)
    return s


def amounts(s: NodeScheduler, job: str) -> tuple[float, float, float, Unit]:
    r = s.pending_refusal(job)
    return r.need, r.free, r.capacity, r.unit


def test_memory_shortage_with_the_largest_free_and_the_gpu_size():
    s = busy()
    assert (code_after(s, "j", spec(gpu_memory_bytes=30 * GiB))) == "insufficient_gpu_memory"
    assert amounts(s, "j") == (30 * GiB, 20 * GiB, 80 * GiB, Unit.GPU_MEMORY)


def test_compute_shortage_with_the_most_free_compute():
    s = busy()
    assert code_after(s, "j", spec(gpu_memory_bytes=1 * GiB, compute_percent=60)) == "insufficient_gpu"
    assert amounts(s, "j") == (600, 500, 1000, Unit.GPU_MILLI)
    assert (
        str(s.pending_refusal("j"))
        == "insufficient free GPU on node 0 (need 60 %, free 50 % of 100 % compute)"
    )


def test_too_few_whole_gpus_counts_the_free_ones():
    s = busy()
    assert (code_after(s, "j", spec(gpus=1))) == "insufficient_gpu"
    assert amounts(s, "j") == (1, 0, 2, Unit.GPUS)


def test_memory_share_behind_whole_gpu_jobs():
    s = NodeScheduler(machine(1))
    s.submit("whole", spec(gpus=1, preemptible=False), 0.0)
    s.step(0.0)
    assert (code_after(s, "j", spec(gpu_memory_bytes=1 * GiB))) == "insufficient_gpu"


def test_no_mig_slot():
    s = NodeScheduler(machine(1, mig=True))
    s.submit("big", spec(mig_profile="7g.80gb", preemptible=False), 0.0)
    s.step(0.0)
    assert (code_after(s, "j", spec(mig_profile="1g.10gb"))) == "no_mig_slot"


def test_topology_need_unmet_by_the_free_gpus():
    topo = profile("dgx1-v100")
    a, b = next((i, j) for i in range(8) for j in range(i + 1, 8) if topo.nvlinks[i, j] == 0)
    s = NodeScheduler(machine(8, topology="dgx1-v100"))
    for g in range(8):
        if g not in (a, b):
            s.adopt(f"on{g}", spec(gpus=1, preemptible=False), (g,), 0.0)
    assert code_after(s, "j", spec(gpus=2, topology=TopologyNeed.NVLINK)) == "no_gpu_set", s.pending_reason(
        "j"
    )
    assert np.count_nonzero(topo.nvlinks) > 0


def test_tenant_quota():
    s = NodeScheduler(machine(2), tenants={"ml": TenantQuota("ml", max_gpus=1)})
    s.submit("first", spec(gpus=1, tenant="ml"), 0.0)
    s.step(0.0)
    assert (code_after(s, "j", spec(gpus=1, tenant="ml"))) == "quota"
    assert amounts(s, "j") == (1, 0, 1, Unit.GPUS)  # needs 1 GPU, 0 left of its quota of 1


def test_waiting_behind_the_head_job():
    s = busy(backfill=False)
    s.submit("head", spec(gpus=2), 0.5)
    assert (code_after(s, "j", spec(gpu_memory_bytes=1 * GiB))) == "behind_queue_head"


def test_preempting():
    s = NodeScheduler(machine(1), grace_seconds=30)
    s.submit("low", spec(gpus=1, priority=Priority.LOW), 0.0)
    s.step(0.0)
    assert (code_after(s, "j", spec(gpus=1, priority=Priority.HIGH))) == "preempting"


def test_unhealthy_gpu_wins_over_the_shortage_it_causes():
    s = NodeScheduler(machine(1))
    s.set_gpu_health(0, False, "XID 79")
    assert (code_after(s, "j", spec(gpus=1))) == "unhealthy_gpu"


def test_a_job_not_yet_considered_is_not_a_failure():
    s = NodeScheduler(machine(1))
    s.submit("j", spec(gpus=1), 0.0)
    assert s.pending_code("j") is RefusalCode.NOT_TRIED
