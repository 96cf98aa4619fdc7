"""NodeScheduler with unhealthy GPUs: no new job goes there, waiting jobs say why, running jobs stay."""

from __future__ import annotations

import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.topology_profiles import profile
from gpuslice.scheduler.node_scheduler import NodeScheduler, PreemptJob, StartJob
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, Priority

H100_BYTES = 80 * GiB


def machine(n: int = 4, *, mig: tuple[int, ...] = ()) -> Machine:
    gpus = tuple(
        GpuInfo(i, f"GPU-{i:04d}", "H100", H100_BYTES, mig_enabled=i in mig, mig_model="h100-80gb")
        for i in range(n)
    )
    return Machine("test", gpus, profile("dgx-h100") if n == 8 else None)


def spec(**fields) -> JobSpec:
    return JobSpec(("run",), **fields)


def gpus_started(decisions) -> dict[str, tuple[int, ...]]:
    return {d.job_id: d.gpus for d in decisions if isinstance(d, StartJob)}


def test_shares_avoid_an_unhealthy_gpu_even_when_best_fit_would_pick_it():
    s = NodeScheduler(machine(2))
    s.submit("fill", spec(gpu_memory_bytes=60 * GiB), 0.0)
    assert gpus_started(s.step(0.0)) == {"fill": (0,)}
    s.set_gpu_health(0, False, "XID 79")
    s.submit("small", spec(gpu_memory_bytes=10 * GiB), 1.0)  # best fit would be GPU 0 (least free)
    assert gpus_started(s.step(1.0)) == {"small": (1,)}
    assert "fill" in s.running()  # the job already on the unhealthy GPU keeps running


def test_a_job_that_fits_only_on_unhealthy_gpus_waits_and_its_reason_names_them():
    s = NodeScheduler(machine(2))
    s.set_gpu_health(1, False, "XID 79")
    s.set_gpu_health(0, False, "uncorrected ECC errors rose from 0 to 2")
    s.submit("job", spec(gpus=1), 0.0)
    assert s.step(0.0) == []
    reason = s.pending_reason("job")
    assert "GPU 0 is unhealthy (uncorrected ECC errors rose from 0 to 2)" in reason
    assert "GPU 1 is unhealthy (XID 79)" in reason and "no new jobs go there" in reason


def test_whole_gpu_gangs_count_only_healthy_gpus():
    s = NodeScheduler(machine(4))
    s.set_gpu_health(2, False, "XID 48")
    s.submit("four", spec(gpus=4), 0.0)
    s.submit("three", spec(gpus=3), 0.0)
    decisions = s.step(0.0)
    assert gpus_started(decisions) == {"three": (0, 1, 3)}
    assert "only 3 healthy" in s.pending_reason("four") and "GPU 2 is unhealthy (XID 48)" in s.pending_reason(
        "four"
    )


def test_a_shortage_elsewhere_is_explained_together_with_the_unhealthy_gpu():
    s = NodeScheduler(machine(2))
    s.submit("big", spec(gpu_memory_bytes=70 * GiB), 0.0)
    s.step(0.0)  # on GPU 0
    s.set_gpu_health(1, False, "XID 79")
    s.submit("also-big", spec(gpu_memory_bytes=70 * GiB), 1.0)
    assert s.step(1.0) == []
    reason = s.pending_reason("also-big")
    assert reason.startswith("needs 70 GiB on one GPU; largest free is 10 GiB on GPU 0")
    assert reason.endswith("GPU 1 is unhealthy (XID 79): no new jobs go there")


def test_mig_instances_are_not_placed_on_an_unhealthy_mig_gpu():
    s = NodeScheduler(machine(2, mig=(0, 1)))
    s.set_gpu_health(0, False, "XID 79")
    s.submit("mig", spec(mig_profile="1g.10gb"), 0.0)
    (start,) = s.step(0.0)
    assert isinstance(start, StartJob) and start.gpus == (1,) and start.mig is not None


def test_preemption_never_frees_a_gpu_that_is_unhealthy():
    s = NodeScheduler(machine(2))
    s.submit("low-a", spec(gpus=1, priority=Priority.LOW), 0.0)
    s.submit("low-b", spec(gpus=1, priority=Priority.LOW), 0.0)
    assert set(gpus_started(s.step(0.0))) == {"low-a", "low-b"}
    s.set_gpu_health(0, False, "XID 79")
    s.submit("high", spec(gpus=1, priority=Priority.HIGH), 1.0)
    victims = [d.job_id for d in s.step(1.0) if isinstance(d, PreemptJob)]
    assert victims == ["low-b"]  # the job on the healthy GPU 1; preempting low-a would not help


def test_a_gpu_marked_healthy_again_takes_jobs_from_the_next_step():
    s = NodeScheduler(machine(1))
    s.set_gpu_health(0, False, "XID 79")
    s.submit("job", spec(gpus=1), 0.0)
    assert s.step(0.0) == []
    s.set_gpu_health(0, True)
    assert gpus_started(s.step(1.0)) == {"job": (0,)}
    assert s.unhealthy_gpus() == {}
    assert s.gpu_usage()[0].unhealthy_reason == ""


def test_health_of_a_gpu_that_does_not_exist_is_refused():
    with pytest.raises(InvalidRequest, match="GPU 9 does not exist"):
        NodeScheduler(machine(2)).set_gpu_health(9, False, "XID 79")
