"""ServeMetrics: the state collector's gauges from a snapshot, and the event counters."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpuslice.ledger.placement import RefusalCode
from gpuslice.observe.metrics import GpuState, PendingState, ServeMetrics, ServeSnapshot, SliceState
from gpuslice.observe.reasons import FailureCode


def samples(metrics: ServeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of one scrape, parsed as Prometheus would."""
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def snapshot() -> ServeSnapshot:
    return ServeSnapshot(
        gpus=[
            GpuState(0, "GPU-a", "H100", 80, 30, True, 40.0, 25, 55.5, 300.0),
            GpuState(1, "GPU-b", "H100", 80, 0, False),  # no reading yet, unhealthy
        ],
        slices=[SliceState("7", "ml", 0, 30, 0.5, 25), SliceState("8", "cv", 0, 0, 0.0, None)],
        pending=[
            PendingState("ml", "high", 2, 9.0),
            PendingState("ml", "low", 1, 3.0),
            PendingState("cv", "low", 1, 1.0),
        ],
        jobs_by_state={"PENDING": 3, "RUNNING": 2},
        info={"version": "0.1.0", "machine": "sim-dgx-h100", "sharing": "soft", "simulated": "true"},
    )


def gpu(i: int, uuid: str) -> tuple[tuple[str, str], ...]:
    return (("gpu", str(i)), ("model", "H100"), ("uuid", uuid))


def test_gpu_gauges_carry_gpu_uuid_and_model_and_use_base_units():
    s = samples(ServeMetrics(snapshot))
    assert s[("gpuslice_gpu_utilization_ratio", gpu(0, "GPU-a"))] == 0.4
    assert s[("gpuslice_gpu_memory_used_bytes", gpu(0, "GPU-a"))] == 25
    assert s[("gpuslice_gpu_memory_allocated_bytes", gpu(0, "GPU-a"))] == 30
    assert s[("gpuslice_gpu_temperature_celsius", gpu(0, "GPU-a"))] == 55.5
    assert s[("gpuslice_gpu_power_watts", gpu(0, "GPU-a"))] == 300.0
    assert s[("gpuslice_gpu_healthy", gpu(0, "GPU-a"))] == 1
    assert s[("gpuslice_gpu_healthy", gpu(1, "GPU-b"))] == 0
    # no reading: the series is absent rather than a made-up 0
    assert ("gpuslice_gpu_temperature_celsius", gpu(1, "GPU-b")) not in s
    assert s[("gpuslice_gpu_memory_total_bytes", gpu(1, "GPU-b"))] == 80


def test_slice_gauges_carry_job_tenant_pod_namespace_and_gpu():
    s = samples(ServeMetrics(snapshot))
    labels = (("gpu", "0"), ("job_id", "7"), ("namespace", ""), ("pod", ""), ("tenant", "ml"))
    assert s[("gpuslice_slice_memory_allocated_bytes", labels)] == 30
    assert s[("gpuslice_slice_compute_allocated_ratio", labels)] == 0.5
    assert s[("gpuslice_slice_memory_used_bytes", labels)] == 25
    idle = (("gpu", "0"), ("job_id", "8"), ("namespace", ""), ("pod", ""), ("tenant", "cv"))
    assert s[("gpuslice_slice_memory_allocated_bytes", idle)] == 0  # an idle job is still exported
    assert ("gpuslice_slice_memory_used_bytes", idle) not in s


def test_queue_gauges_by_tenant_and_priority_and_the_longest_wait():
    s = samples(ServeMetrics(snapshot))
    assert s[("gpuslice_pending_jobs", (("priority", "high"), ("tenant", "ml")))] == 2
    assert s[("gpuslice_pending_jobs", (("priority", "low"), ("tenant", "cv")))] == 1
    assert s[("gpuslice_pending_jobs", (("priority", "low"), ("tenant", "ml")))] == 1
    assert s[("gpuslice_pending_longest_wait_seconds", (("tenant", "ml"),))] == 9.0
    assert s[("gpuslice_jobs", (("state", "RUNNING"),))] == 2
    info = (("machine", "sim-dgx-h100"), ("sharing", "soft"), ("simulated", "true"), ("version", "0.1.0"))
    assert s[("gpuslice_server_info", info)] == 1


def test_event_counters_and_the_latency_histogram():
    m = ServeMetrics(snapshot)
    m.started("high", 0.3)
    m.started("high", 42.0)
    m.preempted("cv", "low")
    m.job_failed(FailureCode.EXIT_CODE)
    m.enforced("suspend", "ml")
    m.fault(1, "GPU-b", "H100", "manual")
    s = samples(m)
    assert s[("gpuslice_scheduler_decisions_total", (("decision", "start"),))] == 2
    assert s[("gpuslice_scheduler_decisions_total", (("decision", "preempt"),))] == 1
    assert s[("gpuslice_preemptions_total", (("priority", "low"), ("tenant", "cv")))] == 1
    assert s[("gpuslice_job_failures_total", (("reason", "exit_code"),))] == 1
    assert s[("gpuslice_enforcement_actions_total", (("action", "suspend"), ("tenant", "ml")))] == 1
    fault = (("gpu", "1"), ("kind", "manual"), ("model", "H100"), ("uuid", "GPU-b"))
    assert s[("gpuslice_gpu_faults_total", fault)] == 1
    assert s[("gpuslice_scheduling_latency_seconds_count", (("priority", "high"),))] == 2
    assert s[("gpuslice_scheduling_latency_seconds_bucket", (("le", "0.5"), ("priority", "high")))] == 1
    assert s[("gpuslice_scheduling_latency_seconds_bucket", (("le", "60.0"), ("priority", "high")))] == 2


def test_a_pending_job_counts_as_a_scheduling_failure_once_per_reason_code():
    m = ServeMetrics(snapshot)
    memory = RefusalCode.INSUFFICIENT_GPU_MEMORY
    m.pending_reasons([("1", RefusalCode.NOT_TRIED)])  # not tried yet
    for _ in range(5):  # the same wait over many passes is one failure
        m.pending_reasons([("1", memory), ("2", memory)])
    m.pending_reasons([("1", RefusalCode.QUOTA)])
    m.pending_reasons([])  # both started or left
    m.pending_reasons([("1", memory)])  # back in the queue (requeued): counts again
    s = samples(m)
    assert s[("gpuslice_scheduling_failures_total", (("reason", "insufficient_gpu_memory"),))] == 3
    assert s[("gpuslice_scheduling_failures_total", (("reason", "quota"),))] == 1
    assert ("gpuslice_scheduling_failures_total", (("reason", "not_tried"),)) not in s


def test_each_metrics_object_has_its_own_registry():
    a, b = ServeMetrics(snapshot), ServeMetrics(snapshot)
    a.started("normal", 1.0)
    assert samples(b)[("gpuslice_scheduler_decisions_total", (("decision", "start"),))] == 0
