"""Tenant quotas on one machine (``scheduler.quota``), asked directly: what a job counts as before and
after it starts, the quota it can never meet and its words, and the refusal record of a full quota."""

from __future__ import annotations

import pytest

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.mig import MigInstance, mig_gpu
from gpuslice.ledger.placement import Refusal, RefusalCode, Unit
from gpuslice.scheduler.node_fit import Holding, demand_for
from gpuslice.scheduler.quota import (
    QuotaShort,
    TenantQuota,
    held_gpus,
    least_use,
    most_gpus,
    never_fits,
    never_reason,
    quota_reason,
    tenant_usage,
)
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec

# GPU 0 in MIG mode (A100-80GB), GPU 1 of 40 GiB, GPU 2 of 80 GiB
MACHINE = Machine(
    "test",
    (
        GpuInfo(0, "GPU-0", "A100-80GB", 80 * GiB, mig_enabled=True, mig_model="a100-80gb"),
        GpuInfo(1, "GPU-1", "A100-40GB", 40 * GiB),
        GpuInfo(2, "GPU-2", "A100-80GB", 80 * GiB),
    ),
    None,
)
A100 = mig_gpu("A100-80GB")


def demand(**fields):
    return demand_for(JobSpec(("run",), **fields), MACHINE)


def test_a_job_without_gpus_counts_nothing_anywhere():
    none = demand(gpus=0)
    assert least_use(MACHINE, none) == (0.0, 0)
    assert most_gpus(MACHINE, none) == 0.0
    assert held_gpus(MACHINE, Holding(())) == 0.0


def test_a_mig_request_counts_its_smallest_profile_at_least_and_its_largest_at_most():
    one = demand(mig_profile="2g.20gb")
    assert least_use(MACHINE, one) == (pytest.approx(2 / 7), A100.profile("2g.20gb").memory_bytes)
    assert most_gpus(MACHINE, one) == pytest.approx(2 / 7)
    by_memory = demand(mig_profile="10GiB")  # any profile of at least 10 GiB, the smallest first
    slices = [p.compute_slices for _, ps in by_memory.mig_options for p in ps]
    memory = [p.memory_bytes for _, ps in by_memory.mig_options for p in ps]
    assert least_use(MACHINE, by_memory) == (pytest.approx(min(slices) / 7), min(memory))
    assert most_gpus(MACHINE, by_memory) == pytest.approx(max(slices) / 7) == 1.0


def test_whole_gpus_count_their_number_and_the_smallest_gpus_memory():
    two = demand(gpus=2)  # GPUs 1 and 2 (GPU 0 is in MIG mode)
    assert least_use(MACHINE, two) == (2.0, 120 * GiB)
    assert most_gpus(MACHINE, two) == 2.0


def test_a_share_counts_its_fraction_of_the_largest_gpu_at_least_and_of_the_smallest_at_most():
    share = demand(gpu_memory_bytes=20 * GiB)
    assert least_use(MACHINE, share) == (0.25, 20 * GiB)
    assert most_gpus(MACHINE, share) == 0.5


def test_what_a_running_job_holds_counts_against_the_gpu_it_sits_on():
    whole = Holding((2,), 1000)
    share = Holding((1,), 1, 10 * GiB)
    instance = Holding((0,), mig=MigInstance(A100.profile("3g.40gb"), 4))
    usage = tenant_usage(MACHINE, [("a", whole), ("b", share), ("a", share), ("c", instance)])
    assert usage == {
        "a": (1.25, 90 * GiB),  # a whole GPU holds all of its memory
        "b": (0.25, 10 * GiB),
        "c": (pytest.approx(3 / 7), A100.profile("3g.40gb").memory_bytes),
    }


def test_a_job_needing_exactly_the_quota_can_run():
    assert never_fits(TenantQuota("t", max_gpus=2), MACHINE, demand(gpus=2)) is None
    exact_memory = TenantQuota("t", max_gpu_memory_bytes=20 * GiB)
    assert never_fits(exact_memory, MACHINE, demand(gpu_memory_bytes=20 * GiB)) is None
    assert never_fits(None, MACHINE, demand(gpus=2)) is None


def test_the_quota_a_job_can_never_meet_names_the_field_the_need_and_the_limit():
    assert never_fits(TenantQuota("t", max_gpus=1), MACHINE, demand(gpus=2)) == QuotaShort(
        "gpus", "2 GPUs", "1 GPUs"
    )
    share = demand(gpu_memory_bytes=40 * GiB, compute_percent=30)
    assert never_fits(TenantQuota("t", max_gpus=0.25), MACHINE, share) == QuotaShort(
        "gpus",
        "0.5 GPUs (40 GiB of a GPU of 80 GiB and 30% of its compute: a share counts the larger fraction)",
        "0.25 GPUs",
    )
    compute_only = demand(gpu_memory_bytes=0, compute_percent=60)
    assert never_fits(TenantQuota("t", max_gpus=0.5), MACHINE, compute_only) == QuotaShort(
        "gpus", "0.6 GPUs", "0.5 GPUs"
    )
    memory = TenantQuota("t", max_gpu_memory_bytes=16 * GiB)
    assert never_fits(memory, MACHINE, demand(gpu_memory_bytes=20 * GiB)) == QuotaShort(
        "gpu_memory_bytes", "20 GiB of GPU memory", "16 GiB GPU memory"
    )


def test_a_waiting_job_under_a_lowered_quota_is_marked_with_the_quota_code():
    reason = never_reason(TenantQuota("t", max_gpus=1), "t", MACHINE, demand(gpus=2))
    assert reason is not None and reason.refusal == Refusal(RefusalCode.QUOTA, 0)
    assert reason.text.startswith("can never run under quota 1 GPUs of tenant t: it needs 2 GPUs")
    assert never_reason(TenantQuota("t", max_gpus=2), "t", MACHINE, demand(gpus=2)) is None


def test_a_full_gpu_quota_is_refused_with_the_gpus_needed_free_and_allowed():
    held = [Holding((2,), 1000), Holding((1,), 1, 10 * GiB)]  # 1.25 GPUs
    reason = quota_reason(TenantQuota("t", max_gpus=2), "t", MACHINE, held, 1.0, 0)
    assert reason is not None
    assert reason.refusal == Refusal(RefusalCode.QUOTA, 0, need=1.0, free=0.75, capacity=2, unit=Unit.GPUS)
    assert reason.text == "tenant t at its quota of 2 GPUs (1.25 in use, this job needs 1)"
    assert quota_reason(TenantQuota("t", max_gpus=2), "t", MACHINE, held, 0.75, 0) is None


def test_a_full_memory_quota_is_refused_with_the_memory_needed_free_and_allowed():
    held = [Holding((2,), 1000), Holding((1,), 1, 10 * GiB)]  # 90 GiB
    quota = TenantQuota("t", max_gpu_memory_bytes=100 * GiB)
    reason = quota_reason(quota, "t", MACHINE, held, 0.0, 20 * GiB)
    assert reason is not None
    assert reason.refusal == Refusal(
        RefusalCode.QUOTA, 0, need=20 * GiB, free=10 * GiB, capacity=100 * GiB, unit=Unit.GPU_MEMORY
    )
    assert reason.text == "tenant t at its quota of 100 GiB GPU memory (90 GiB in use, this job needs 20 GiB)"
    assert quota_reason(quota, "t", MACHINE, held, 0.0, 10 * GiB) is None  # exactly the quota
