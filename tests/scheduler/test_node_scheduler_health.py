"""Serve's node scheduler through its public calls: GPUs marked unhealthy (no new job goes there, the
waiting job's reason says so) and the per-GPU usage ``gpuslice gpus`` shows."""

from __future__ import annotations

import pytest
from test_node_scheduler import machine, spec, started

from gpuslice.errors import InvalidRequest
from gpuslice.ledger.placement import RefusalCode
from gpuslice.scheduler.node_decisions import GpuUsage
from gpuslice.scheduler.node_scheduler import NodeScheduler
from gpuslice.units import GiB


def test_an_unhealthy_gpu_takes_no_new_job_until_it_is_healthy_again():
    s = NodeScheduler(machine(2, topology=None))
    with pytest.raises(InvalidRequest, match=r"^gpu: GPU 2 does not exist \(this machine has 0–1\)$"):
        s.set_gpu_health(2, False)
    with pytest.raises(InvalidRequest, match="GPU -1 does not exist"):
        s.set_gpu_health(-1, False)
    s.set_gpu_health(0, False, "Xid 79")
    s.set_gpu_health(1, False)
    assert s.unhealthy_gpus() == {0: "Xid 79", 1: "marked unhealthy"}
    s.set_gpu_health(1, True)
    assert s.unhealthy_gpus() == {0: "Xid 79"}
    s.submit("share", spec(gpu_memory_bytes=10 * GiB), 0)
    assert started(s.step(1)) == {"share": (1,)}  # best fit would take GPU 0, the lower of two equal GPUs
    s.submit("two", spec(gpus=2), 1)
    assert started(s.step(2)) == {}
    assert s.pending_code("two") is RefusalCode.UNHEALTHY_GPU
    assert s.pending_refusal("two").code is RefusalCode.UNHEALTHY_GPU
    assert s.pending_reason("two") == (
        "needs 2 GPU(s) it may use; only 1 healthy; GPU 0 is unhealthy (Xid 79): no new jobs go there"
    )
    with pytest.raises(KeyError, match="job 'share' is not pending"):
        s.pending_refusal("share")
    s.set_gpu_health(0, True)
    s.finished("share")
    assert started(s.step(4)) == {"two": (0, 1)}


def test_a_job_with_enough_healthy_gpus_that_are_busy_says_both():
    s = NodeScheduler(machine(2, topology=None))
    s.submit("a", spec(gpus=1), 0)
    assert started(s.step(1)) == {"a": (0,)}
    s.set_gpu_health(1, False, "ECC")
    s.submit("b", spec(gpus=1), 1)
    s.step(2)
    assert s.pending_code("b") is RefusalCode.UNHEALTHY_GPU
    assert s.pending_reason("b") == (
        "needs 1 whole GPU; 0 are free; GPU 1 is unhealthy (ECC): no new jobs go there"
    )


def test_gpu_usage_shows_each_gpus_jobs_memory_compute_outside_use_mig_slots_and_health():
    s = NodeScheduler(machine(3, mig=(2,), topology=None))
    s.submit("whole", spec(gpus=1), 0)
    s.submit("share", spec(gpu_memory_bytes=20 * GiB, compute_percent=30), 0)
    s.submit("mig", spec(mig_profile="3g.40gb"), 0)
    assert set(started(s.step(1))) == {"whole", "share", "mig"}
    s.set_external_usage(1, 5 * GiB)
    s.set_gpu_health(1, False, "fan")
    usage = {u.index: u for u in s.gpu_usage()}
    whole_gpu = s.running()["whole"][0]
    share_gpu = s.running()["share"][0]
    assert usage[whole_gpu].memory_free_bytes == 0 and usage[whole_gpu].compute_free_milli == 0
    assert usage[whole_gpu].job_ids == ("whole",)
    share = usage[share_gpu]
    assert (share.memory_free_bytes, share.compute_free_milli, share.job_ids) == (
        80 * GiB - 20 * GiB - share.external_bytes,
        700 - (1 if share.external_bytes else 0),
        ("share",),
    )
    assert usage[1].external_bytes == 5 * GiB and usage[1].unhealthy_reason == "fan"
    assert usage[0].unhealthy_reason == "" and usage[0].external_bytes == 0
    mig = usage[2]
    assert mig == GpuUsage(
        index=2,
        model="H100",
        memory_total_bytes=80 * GiB,
        memory_free_bytes=mig.memory_free_bytes,
        compute_free_milli=mig.compute_free_milli,
        job_ids=("mig",),
        mig_enabled=True,
        mig_slots=mig.mig_slots,
    )
    assert mig.mig_slots.count("#") == 4 and not usage[0].mig_enabled and usage[0].mig_slots == ""


def test_a_gpu_healthy_again_is_used_at_once_while_another_stays_unhealthy():
    s = NodeScheduler(machine(3, topology=None))
    s.set_gpu_health(0, False, "Xid 79")
    s.set_gpu_health(2, False, "ECC")
    s.submit("two", spec(gpus=2), 0)
    assert started(s.step(1)) == {}
    s.set_gpu_health(0, True)
    assert started(s.step(2)) == {"two": (0, 1)}


def test_memory_used_outside_is_taken_from_what_shares_may_use_and_retaken_after_a_whole_gpu_job():
    s = NodeScheduler(machine(2, mig=(1,), topology=None))
    with pytest.raises(InvalidRequest, match=r"^gpu: GPU 2 does not exist \(this machine has 0–1\)$"):
        s.set_external_usage(2, GiB)
    free_memory = s.ledger.view.free_gpu_memory_bytes
    s.set_external_usage(0, 30 * GiB)
    assert free_memory[0, 0] == 50 * GiB and s.ledger.view.free_gpu_milli[0, 0] == 999
    s.set_external_usage(0, 20 * GiB)  # the old amount is given back first
    assert free_memory[0, 0] == 60 * GiB
    s.set_external_usage(1, 20 * GiB)  # a GPU in MIG mode: counted, not taken from the ledger
    assert free_memory[0, 1] == 80 * GiB and s.gpu_usage()[1].external_bytes == 20 * GiB
    s.set_external_usage(0, -5)
    assert free_memory[0, 0] == 80 * GiB and s.gpu_usage()[0].external_bytes == 0
    s.submit("whole", spec(gpus=1), 0)
    assert started(s.step(1)) == {"whole": (0,)}
    s.set_external_usage(0, 10 * GiB)  # held whole: nothing to take now
    assert s.ledger.view.free_gpu_milli[0, 0] == 0 and free_memory[0, 0] == 80 * GiB
    assert s.gpu_usage()[0].external_bytes == 10 * GiB
    s.finished("whole")
    assert free_memory[0, 0] == 70 * GiB and s.ledger.view.free_gpu_milli[0, 0] == 999
    s.set_external_usage(0, 100 * GiB)  # more than the GPU has: clamped to what is free
    assert free_memory[0, 0] == 0
    s.ledger.check_invariants()


def test_a_job_id_must_be_new_and_not_empty_and_a_cancelled_job_leaves_the_queue():
    s = NodeScheduler(machine(1, topology=None))
    with pytest.raises(InvalidRequest, match=r"^job_id: cannot be empty$"):
        s.submit("", spec(gpus=1), 0)
    s.submit("a", spec(gpus=1), 0)
    s.submit("b", spec(gpus=1), 0)
    with pytest.raises(InvalidRequest, match=r"^job_id: 'b' is already pending; finish or cancel it first$"):
        s.submit("b", spec(gpus=1), 0)
    assert started(s.step(1)) == {"a": (0,)}
    with pytest.raises(InvalidRequest, match=r"^job_id: 'a' is already running; finish or cancel it first$"):
        s.adopt("a", spec(gpus=1), (0,), 0)
    s.submit("c", spec(gpus=1), 1)
    s.step(2)
    s.cancel("b")
    s.cancel("a")  # running: left alone
    assert s.running() == {"a": (0,)}
    with pytest.raises(KeyError):
        s.pending_reason("b")
    s.submit("b", spec(gpus=1), 2)  # submitted again: it queues behind the jobs of the last step
    assert [i for i, _ in s.queue()] == ["c", "b"]
    s.cancel("b")
    s.finished("a")
    assert started(s.step(3)) == {"c": (0,)}
