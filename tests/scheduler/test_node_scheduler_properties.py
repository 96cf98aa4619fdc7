"""Property test: any sequence of submit / finish / cancel / outside usage / step on an 8-GPU DGX H100
(GPU 7 in MIG mode) keeps the ledger consistent and every decision legal."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.topology_profiles import profile
from gpuslice.scheduler.node_scheduler import NodeScheduler, PreemptJob, StartJob, TenantQuota
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, Priority, TopologyNeed

MACHINE = Machine(
    "dgx",
    tuple(
        GpuInfo(i, f"GPU-{i}", "H100", 80 * GiB, mig_enabled=i == 7, mig_model="h100-80gb") for i in range(8)
    ),
    profile("dgx-h100"),
)
TENANTS = {
    "ml": TenantQuota("ml", max_gpus=3),
    "cv": TenantQuota("cv", weight=2.0, max_gpu_memory_bytes=120 * GiB),
}


@st.composite
def specs(draw) -> JobSpec:
    kind = draw(st.sampled_from(["whole", "share", "mig", "nvlink"]))
    common = {
        "priority": draw(st.sampled_from(list(Priority))),
        "tenant": draw(st.sampled_from(["ml", "cv", "web"])),
        "preemptible": draw(st.booleans()),
        "max_runtime_seconds": draw(st.sampled_from([None, 5.0, 50.0])),
    }
    if kind == "whole":
        return JobSpec(("run",), gpus=draw(st.integers(1, 7)), **common)
    if kind == "nvlink":
        return JobSpec(("run",), gpus=draw(st.integers(2, 4)), topology=TopologyNeed.NVLINK, **common)
    if kind == "mig":
        return JobSpec(
            ("run",), mig_profile=draw(st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb", "15GiB"])), **common
        )
    memory = draw(st.integers(0, 80)) * GiB
    compute = draw(st.sampled_from([0, 25, 50, 99])) if memory else draw(st.sampled_from([25, 50, 99]))
    return JobSpec(("run",), gpu_memory_bytes=memory, compute_percent=compute, **common)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), specs()),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("external"), st.tuples(st.integers(0, 7), st.integers(0, 90))),
        st.tuples(st.just("step"), st.floats(0, 400)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops)
def test_no_sequence_breaks_the_ledger_or_makes_an_illegal_decision(ops):
    s = NodeScheduler(MACHINE, tenants=TENANTS, aging_seconds=100.0)
    specs_by_id: dict[str, JobSpec] = {}
    pending: set[str] = set()
    running: set[str] = set()
    now = 0.0
    for n, (kind, arg) in enumerate(ops):
        if kind == "submit":
            job_id = f"j{n}"
            try:
                s.submit(job_id, arg, now)
            except InvalidRequest:  # can never run here (e.g. beyond its tenant's quota): not queued
                assert job_id not in {i for i, _ in s.queue()}
                continue
            specs_by_id[job_id] = arg
            pending.add(job_id)
        elif kind == "finish" and running:
            victim = sorted(running)[arg % len(running)]
            s.finished(victim)
            running.discard(victim)
        elif kind == "cancel" and pending:
            gone = sorted(pending)[arg % len(pending)]
            s.cancel(gone)
            pending.discard(gone)
        elif kind == "external":
            gpu, gib = arg
            s.set_external_usage(gpu, gib * GiB)
        elif kind == "step":
            now += arg
            for d in s.step(now):
                if isinstance(d, StartJob):
                    assert d.job_id in pending, f"{d.job_id} started but was not pending"
                    pending.discard(d.job_id)
                    running.add(d.job_id)
                else:
                    assert isinstance(d, PreemptJob)
                    assert d.job_id in running, f"{d.job_id} preempted but not running"
                    victim, winner = specs_by_id[d.job_id], specs_by_id[d.for_job]
                    assert victim.preemptible
                    assert victim.priority < winner.priority
        s.ledger.check_invariants()
        for usage in s.gpu_usage():
            assert 0 <= usage.compute_free_milli <= 1000
        whole = [g for job_id, gpus in s.running().items() if len(gpus) > 1 for g in gpus]
        assert len(whole) == len(set(whole)), "a GPU given whole to two jobs"
        assert set(s.running()) == running
        for job_id in pending:
            assert s.pending_reason(job_id), f"{job_id} pending without a reason"
        assert {i for i, _ in s.queue()} == pending
        for tenant, quota in TENANTS.items():
            if quota.max_gpus is not None:
                view = s._view(now)  # the usage quotas are checked against
                assert view.usage(tenant) <= quota.max_gpus + 1e-9
