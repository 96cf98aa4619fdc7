"""A quota counts what a job denies others: a memory-only share counts its memory fraction of its GPU.

The hole these close: a share asking for memory only reserves 1 milli of compute, and quotas, fair share
and preemption counted only compute, so a tenant with max_gpus 1 held four 54 GiB shares on four H100s
(0.004 GPUs by that count) and preempted another team's jobs to get them."""

from __future__ import annotations

import pytest

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.topology_profiles import profile
from gpuslice.scheduler.node_scheduler import NodeScheduler, PreemptJob, StartJob, TenantQuota
from gpuslice.scheduler.quota import QuotaNeverFits
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, Priority

H100 = 80 * GiB


def machine(sizes: tuple[int, ...] = (H100,) * 8) -> Machine:
    gpus = tuple(GpuInfo(i, f"GPU-{i}", "H100", size) for i, size in enumerate(sizes))
    return Machine("test", gpus, profile("dgx-h100") if len(sizes) == 8 else None)


def share(gib: float, tenant: str = "ml", **fields) -> JobSpec:
    return JobSpec(("run",), gpu_memory_bytes=int(gib * GiB), tenant=tenant, **fields)


def started(decisions) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, StartJob)]


def preempted(decisions) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, PreemptJob)]


def test_memory_only_shares_count_their_memory_fraction_against_max_gpus():
    s = NodeScheduler(machine(), tenants={"ml": TenantQuota("ml", max_gpus=1)})
    for i in range(4):
        s.submit(f"m{i}", share(54), 0)  # 54 of 80 GiB: 0.675 of a GPU each
    assert started(s.step(1)) == ["m0"]
    assert s.tenant_usage()["ml"][0] == pytest.approx(54 / 80)
    for i in (1, 2, 3):
        assert s.pending_reason(f"m{i}").startswith("tenant ml at its quota of 1 GPUs (0.675 in use")


def test_compute_counts_when_it_is_the_larger_fraction():
    s = NodeScheduler(machine(), tenants={"ml": TenantQuota("ml", max_gpus=1)})
    s.submit("a", share(8, compute_percent=60), 0)  # 0.1 memory, 0.6 compute: 0.6
    s.submit("b", share(8, compute_percent=60), 0)
    assert started(s.step(1)) == ["a"]
    assert s.tenant_usage()["ml"][0] == pytest.approx(0.6)


def test_a_memory_only_share_cannot_preempt_another_team_beyond_its_quota():
    s = NodeScheduler(machine(), tenants={"ml": TenantQuota("ml", max_gpus=1)})
    for g in range(8):
        s.submit(f"b{g}", JobSpec(("run",), tenant="vision", priority=Priority.LOW), 0)
    assert len(started(s.step(1))) == 8
    for i in range(4):
        s.submit(f"m{i}", share(54, priority=Priority.HIGH), 2)
    victims = []
    now = 2.0
    for _ in range(8):  # each preempted job ends at once; the next step may start or preempt again
        now += 1
        decisions = s.step(now)
        victims += preempted(decisions)
        for v in preempted(decisions):
            s.finished(v)
    assert len(victims) == 1, f"ml (max_gpus 1) preempted {victims} for 0.675-GPU shares"
    assert list(s.running()).count("m0") == 1 and "m1" not in s.running()


def test_a_share_never_evicts_a_job_only_to_wait_on_its_quota_where_the_freed_gpu_is_small():
    # 30 GiB is 0.375 of the 80 GiB GPU but 0.75 of the 40 GiB one, and ml may hold 0.5. The job on the
    # 40 GiB GPU started last, so it is the cheaper victim: evicting it frees a GPU where the share would
    # count 0.75, beyond the quota. Every eviction must end with the job it was made for running.
    m = Machine("mixed", (GpuInfo(0, "GPU-0", "H100", H100), GpuInfo(1, "GPU-1", "A100", 40 * GiB)))
    s = NodeScheduler(m, tenants={"ml": TenantQuota("ml", max_gpus=0.5)})
    s.submit("v80", JobSpec(("run",), tenant="vision", priority=Priority.LOW, gpu_models=("H100",)), 0)
    s.step(1)
    s.submit("v40", JobSpec(("run",), tenant="vision", priority=Priority.LOW, gpu_models=("A100",)), 2)
    s.step(3)
    s.submit("new", share(30, priority=Priority.HIGH), 4)
    victims = []
    for now in range(5, 12):
        decisions = s.step(now)
        for v in preempted(decisions):
            victims.append(v)
            s.finished(v)
    assert not victims or "new" in s.running(), f"evicted {victims}, yet new waits: {s.pending_reason('new')}"


def test_a_job_needing_more_than_the_whole_quota_is_refused_at_submit_with_both_numbers():
    s = NodeScheduler(machine(), tenants={"ml": TenantQuota("ml", max_gpus=0.5)})
    with pytest.raises(QuotaNeverFits) as err:
        s.submit("big", share(60), 0)
    text = str(err.value)
    assert "0.75 GPUs" in text and "60 GiB of a GPU of 80 GiB" in text
    assert "tenant ml's quota is 0.5 GPUs" in text
    assert err.value.http_status == 422
    assert s.queue() == []


def test_lowering_a_quota_marks_the_waiting_job_and_it_stays_queued():
    s = NodeScheduler(machine(), tenants={"ml": TenantQuota("ml", max_gpus=2)})
    s.submit("w", share(60), 0)
    assert s.set_tenants({"ml": TenantQuota("ml", max_gpus=0.5)}) == ["w"]
    assert s.pending_reason("w").startswith("can never run under quota 0.5 GPUs of tenant ml: it needs 0.75")
    assert s.set_tenants({"ml": TenantQuota("ml", max_gpus=0.5)}) == []  # marked once
    assert started(s.step(1)) == [] and s.pending_reason("w").startswith("can never run under quota")
    s.set_tenants({"ml": TenantQuota("ml", max_gpus=1)})
    assert started(s.step(2)) == ["w"]


def test_a_requeued_or_recovered_job_is_queued_whatever_the_quota_says_now():
    s = NodeScheduler(machine(), tenants={"ml": TenantQuota("ml", max_gpus=0.5)})
    s.submit("r", share(60), 0, admitted=True)
    assert s.pending_reason("r").startswith("can never run under quota 0.5 GPUs")
    assert list(s.never_runs()) == ["r"]
