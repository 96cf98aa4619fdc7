"""The metrics of ``gpuslice serve``: one registry per daemon, served at ``GET /metrics``.

Two kinds, kept apart on purpose:

- **events** (counters, the latency histogram) are counted by the daemon when they happen, through
  the ``ServeMetrics`` methods: a start decision, a preemption, a job failure, an enforcement action,
  a GPU fault, an anomaly;
- **state** (gauges: GPUs, slices, the queue) is read from a ``ServeSnapshot`` the daemon builds at
  scrape time, so a scrape always shows the state as it is, and nothing is kept twice.

Names follow Prometheus' conventions: the ``gpuslice_`` prefix, base units (bytes, seconds, ratios
0–1, watts, degrees Celsius), ``_total`` on counters. docs/metrics.md lists every metric;
tests/observe/test_metrics_doc.py keeps that table and this registry in step. Labels never hold
numbers that grow without bound (job ids do: one series per running job, gone when it ends).
Pod and namespace are empty under serve; the labels exist so dashboards work for both serve and
Kubernetes (Project-HAMi/HAMi#112: pod labels lost under device sharing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuslice.hardware.faults import FaultKind
from gpuslice.ledger.placement import RefusalCode
from gpuslice.observe.reasons import FailureCode

__all__ = [
    "ENFORCEMENT_ACTIONS",
    "GPU_LABELS",
    "LATENCY_BUCKETS_SECONDS",
    "SLICE_LABELS",
    "GpuState",
    "PendingState",
    "ServeMetrics",
    "ServeSnapshot",
    "SliceState",
    "gpu_healthy_family",
]

GPU_LABELS = ("gpu", "uuid", "model")
# "job_id", not "job": Prometheus gives every scraped series its own ``job`` label (the scrape job), and
# a metric label of that name would come back renamed ``exported_job``.
SLICE_LABELS = ("job_id", "tenant", "pod", "namespace", "gpu")
ENFORCEMENT_ACTIONS = ("warn", "throttle", "suspend", "resume", "kill")
# Submit-to-start waits on one machine range from one tick (0.2 s) to hours behind a long job.
LATENCY_BUCKETS_SECONDS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)


@dataclass(frozen=True, slots=True)
class GpuState:
    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    memory_allocated_bytes: int  # the slices' memory on it (whole-GPU jobs: all of it)
    healthy: bool
    utilization_percent: float | None = None  # None: no reading yet
    memory_used_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None


@dataclass(frozen=True, slots=True)
class SliceState:
    """One running job's part of one GPU."""

    job: str
    tenant: str
    gpu: int
    memory_allocated_bytes: int
    compute_allocated_ratio: float  # 0..1 of the GPU's SMs
    memory_used_bytes: int | None  # None: not measured yet
    pod: str = ""
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class PendingState:
    """The jobs waiting with one tenant and priority."""

    tenant: str
    priority: str
    jobs: int
    longest_wait_seconds: float  # since the longest-waiting one entered the queue (submit or requeue)


@dataclass(frozen=True, slots=True)
class ServeSnapshot:
    gpus: Sequence[GpuState]
    slices: Sequence[SliceState]
    pending: Sequence[PendingState]
    jobs_by_state: dict[str, int]
    info: dict[str, str] = field(default_factory=dict)  # version, machine, sharing, simulated


class _StateCollector(Collector):
    """Gauges from a fresh snapshot at every scrape."""

    def __init__(self, snapshot: Callable[[], ServeSnapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        return iter(())  # names are known only at collect time; the registry does not need them early

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        yield from _gpu_families(s.gpus)
        yield from _slice_families(s.slices)
        yield from _queue_families(s)


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _gpu_families(gpus: Sequence[GpuState]) -> Iterator[Metric]:
    util = _gauge("gpuslice_gpu_utilization_ratio", "GPU busy time, 0-1 (NVML or the simulated model)",
                  GPU_LABELS)  # fmt: skip
    used = _gauge("gpuslice_gpu_memory_used_bytes", "GPU memory in use by any process", GPU_LABELS)
    total = _gauge("gpuslice_gpu_memory_total_bytes", "GPU memory in total", GPU_LABELS)
    allocated = _gauge("gpuslice_gpu_memory_allocated_bytes", "GPU memory given to running slices",
                       GPU_LABELS)  # fmt: skip
    temp = _gauge("gpuslice_gpu_temperature_celsius", "GPU core temperature", GPU_LABELS)
    power = _gauge("gpuslice_gpu_power_watts", "GPU board power draw", GPU_LABELS)
    for g in gpus:
        labels = [str(g.index), g.uuid, g.model]
        total.add_metric(labels, g.memory_total_bytes)
        allocated.add_metric(labels, g.memory_allocated_bytes)
        if g.utilization_percent is not None:
            util.add_metric(labels, g.utilization_percent / 100)
        if g.memory_used_bytes is not None:
            used.add_metric(labels, g.memory_used_bytes)
        if g.temperature_celsius is not None:
            temp.add_metric(labels, g.temperature_celsius)
        if g.power_watts is not None:
            power.add_metric(labels, g.power_watts)
    yield from (util, used, total, allocated, temp, power)
    yield gpu_healthy_family([(g.index, g.uuid, g.model, g.healthy) for g in gpus])


def gpu_healthy_family(gpus: Sequence[tuple[int, str, str, bool]]) -> GaugeMetricFamily:
    """gpuslice_gpu_healthy from (index, uuid, model, healthy) rows: the same gauge in serve and the
    device plugin, so one alert rule covers both."""
    family = _gauge("gpuslice_gpu_healthy", "1 if the GPU takes new jobs, 0 if marked unhealthy", GPU_LABELS)
    for index, uuid, model, healthy in gpus:
        family.add_metric([str(index), uuid, model], 1.0 if healthy else 0.0)
    return family


def _slice_families(slices: Sequence[SliceState]) -> Iterator[Metric]:
    memory = _gauge("gpuslice_slice_memory_allocated_bytes", "GPU memory a running job may use on a GPU",
                    SLICE_LABELS)  # fmt: skip
    compute = _gauge("gpuslice_slice_compute_allocated_ratio", "share of a GPU's compute given to a job, 0-1",
                     SLICE_LABELS)  # fmt: skip
    used = _gauge("gpuslice_slice_memory_used_bytes", "GPU memory a running job really holds on a GPU",
                  SLICE_LABELS)  # fmt: skip
    for s in slices:
        labels = [s.job, s.tenant, s.pod, s.namespace, str(s.gpu)]
        memory.add_metric(labels, s.memory_allocated_bytes)
        compute.add_metric(labels, s.compute_allocated_ratio)
        if s.memory_used_bytes is not None:
            used.add_metric(labels, s.memory_used_bytes)
    yield from (memory, compute, used)


def _queue_families(s: ServeSnapshot) -> Iterator[Metric]:
    jobs = _gauge("gpuslice_jobs", "jobs by state", ("state",))
    for state, n in sorted(s.jobs_by_state.items()):
        jobs.add_metric([state], n)
    pending = _gauge("gpuslice_pending_jobs", "jobs waiting to start", ("tenant", "priority"))
    oldest = _gauge("gpuslice_pending_longest_wait_seconds", "how long the longest-waiting job has waited",
                    ("tenant",))  # fmt: skip
    counts: dict[tuple[str, str], int] = {}
    waits: dict[str, float] = {}
    for p in s.pending:
        counts[(p.tenant, p.priority)] = counts.get((p.tenant, p.priority), 0) + p.jobs
        waits[p.tenant] = max(waits.get(p.tenant, 0.0), p.longest_wait_seconds)
    for (tenant, priority), n in sorted(counts.items()):
        pending.add_metric([tenant, priority], n)
    for tenant, wait in sorted(waits.items()):
        oldest.add_metric([tenant], wait)
    info = _gauge("gpuslice_server_info", "always 1; the labels describe the server", sorted(s.info))
    info.add_metric([s.info[k] for k in sorted(s.info)], 1)
    yield from (jobs, pending, oldest, info)


class ServeMetrics:
    """The registry of one daemon: event counters it increments, plus the state collector."""

    def __init__(self, snapshot: Callable[[], ServeSnapshot]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decisions = Counter("gpuslice_scheduler_decisions", "scheduling decisions taken, by kind",
                                 ["decision"], registry=r)  # fmt: skip
        self.preemptions = Counter("gpuslice_preemptions", "running jobs preempted, by the victim's tenant "
                                   "and priority", ["tenant", "priority"], registry=r)  # fmt: skip
        self.scheduling_failures = Counter(
            "gpuslice_scheduling_failures", "a pending job found unplaceable, counted once per job and "
            "reason code (not every pass)", ["reason"], registry=r,
        )  # fmt: skip
        self.job_failures = Counter("gpuslice_job_failures", "jobs that ended FAILED, by reason code",
                                    ["reason"], registry=r)  # fmt: skip
        self.latency = Histogram("gpuslice_scheduling_latency_seconds", "submit (or requeue) to start",
                                 ["priority"], buckets=LATENCY_BUCKETS_SECONDS, registry=r)  # fmt: skip
        self.enforcement = Counter("gpuslice_enforcement_actions", "graded-response actions taken",
                                   ["action", "tenant"], registry=r)  # fmt: skip
        self.faults = Counter("gpuslice_gpu_faults", "faults that marked a GPU unhealthy",
                              [*GPU_LABELS, "kind"], registry=r)  # fmt: skip
        self.anomalies = Counter("gpuslice_gpu_anomalies", "3-sigma excursions of a GPU's telemetry",
                                 [*GPU_LABELS, "metric"], registry=r)  # fmt: skip
        for decision in ("start", "preempt"):
            self.decisions.labels(decision)
        self._pending_codes: dict[str, RefusalCode] = {}  # job -> last counted reason code
        r.register(_StateCollector(snapshot))

    # -- events the daemon reports -------------------------------------------------------------------

    def started(self, priority: str, waited_seconds: float) -> None:
        self.decisions.labels("start").inc()
        self.latency.labels(priority).observe(max(0.0, waited_seconds))

    def preempted(self, tenant: str, priority: str) -> None:
        self.decisions.labels("preempt").inc()
        self.preemptions.labels(tenant, priority).inc()

    def pending_reasons(self, codes: Sequence[tuple[str, RefusalCode]]) -> None:
        """The queue after a pass, [(job, reason code)]: counts each job's code when it changes."""
        seen = {}
        for job, code in codes:
            seen[job] = code
            if code is not RefusalCode.NOT_TRIED and self._pending_codes.get(job) is not code:
                self.scheduling_failures.labels(code.label).inc()
        self._pending_codes = seen

    def job_failed(self, code: FailureCode) -> None:
        self.job_failures.labels(code.value).inc()

    def enforced(self, action: str, tenant: str) -> None:
        self.enforcement.labels(action, tenant).inc()

    def fault(self, gpu: int, uuid: str, model: str, kind: str) -> None:
        FaultKind(kind)  # ValueError for a kind that is not one of the fixed ones
        self.faults.labels(str(gpu), uuid, model, kind).inc()

    def anomaly(self, gpu: int, uuid: str, model: str, metric: str) -> None:
        self.anomalies.labels(str(gpu), uuid, model, metric).inc()

    def exposition(self) -> bytes:
        """The text exposition (prometheus-client's ``CONTENT_TYPE_LATEST``) that ``GET /metrics`` serves."""
        return generate_latest(self.registry)
