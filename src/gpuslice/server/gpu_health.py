"""The serve daemon's GPU watch: telemetry, health marks and anomalies (``Daemon`` holds one).

```text
telemetry.read(loads)  -> per-GPU utilisation, memory, temperature, power (NVML or the simulated model)
a reading's faults     -> the GPU is marked unhealthy (as set_gpu_health from the API does by hand)
health change          -> scheduler.set_gpu_health (no new jobs there), an event for the GPU and one per
                          job running on it (they keep running), gpuslice_gpu_faults_total
readings               -> one 3-sigma detector per GPU and metric; a job starting or ending on a GPU
                          resets its series (an expected change is not news)
```
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpuslice.hardware.faults import FaultKind
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import mig_gpu
from gpuslice.node.telemetry import GpuReading, SliceLoad, Telemetry
from gpuslice.observe.anomaly import SigmaDetector
from gpuslice.observe.health import GpuHealth, HealthBook, HealthChange
from gpuslice.observe.metrics import ServeMetrics
from gpuslice.scheduler.node_scheduler import NodeScheduler
from gpuslice.server.errors import GpuNotFound
from gpuslice.server.store import JobRecord, Store
from gpuslice.units import format_size
from gpuslice.workload.equivalent import gpu_equivalent

__all__ = ["GpuWatch", "anomaly_detector", "anomaly_text", "restored_health"]

_log = logging.getLogger("gpuslice.server")

# Telemetry series per GPU for the anomaly detector, and the wobble in each that is never news: 2
# percentage points of utilisation, 1 % of the GPU's memory, 1 °C.
_ANOMALY_METRICS = ("utilization", "memory_used", "temperature")
_ANOMALY_MIN_STD = (2.0, 0.01, 1.0)


def anomaly_text(gpu: int, metric: str, value: float, mean: float, sigmas: float) -> str:
    """'GPU 3 memory used 70 GiB is 4.2 sigma from its recent mean 12.5 GiB', each value in its unit."""

    def shown(v: float) -> str:
        if metric == "memory_used":
            return format_size(round(v))
        return f"{v:.0f} °C" if metric == "temperature" else f"{v:.0f} %"

    return (
        f"GPU {gpu} {metric.replace('_', ' ')} {shown(value)} is {sigmas:.1f} sigma from its recent mean "
        f"{shown(mean)}"
    )


def restored_health(store: Store, machine: Machine) -> HealthBook:
    """The health book as the store left it. Marks outlive a restart (an XID'd GPU must not take jobs
    again because the server restarted); a mark is kept only for the GPU it was made for (same index
    and UUID)."""
    health = HealthBook(machine.gpu_count)
    for g, uuid, healthy, reason, kind, since in store.gpu_health():
        if not healthy and g < machine.gpu_count and machine.gpus[g].uuid == uuid:
            health.restore(g, GpuHealth(False, reason, kind, since))
    return health


def anomaly_detector(machine: Machine) -> SigmaDetector:
    """One series per GPU and metric in ``_ANOMALY_METRICS``, each with its never-news wobble."""
    return SigmaDetector(
        len(_ANOMALY_METRICS) * machine.gpu_count,
        min_std=[
            floor * (g.memory_bytes if name == "memory_used" else 1)
            for g in machine.gpus
            for name, floor in zip(_ANOMALY_METRICS, _ANOMALY_MIN_STD, strict=True)
        ],
    )


class GpuWatch:
    """Telemetry, GPU health and anomalies, and the GPU memory each job was last seen to use.

    Owns the health book (restored from the store: marks outlive a restart), the anomaly detector, the
    last telemetry readings and the last monitor pass's memory use. ``observe`` runs inside a tick and
    ``mark`` for an API call, both with the daemon's lock (``lock``) held by the caller; ``scheduler``
    gives the daemon's scheduler of the moment (recovery replaces it), which health changes reach.
    """

    def __init__(
        self,
        machine: Machine,
        store: Store,
        metrics: ServeMetrics,
        telemetry: Telemetry | None,
        *,
        scheduler: Callable[[], NodeScheduler],
        wake: threading.Event,
        clock: Callable[[], float],
    ) -> None:
        self._machine = machine
        self._store = store
        self._metrics = metrics
        self.telemetry = telemetry  # None: no GPU readings (tests with a fake node)
        self._scheduler = scheduler
        self._wake = wake
        self._clock = clock
        self.health = restored_health(store, machine)
        self.anomalies = anomaly_detector(machine)
        self.usage: dict[str, dict[int, int]] = {}  # job -> GPU -> bytes, from the last monitor pass
        self.external: dict[int, int] = {}  # GPU -> bytes held by processes outside gpuslice
        self.readings: dict[int, GpuReading] = {}  # GPU -> the last telemetry reading
        self._gpu_jobs: list[frozenset[str]] = [frozenset()] * machine.gpu_count

    def mark(self, gpu: int, healthy: bool, reason: str) -> None:
        """Mark a GPU unhealthy by hand (a fault injected on a simulated GPU, or an operator draining a
        real one) or healthy again; GpuNotFound when there is no such GPU. Call with the lock held."""
        if not 0 <= gpu < self._machine.gpu_count:
            raise GpuNotFound(f"no GPU {gpu}; this machine has GPU 0–{self._machine.gpu_count - 1}")
        now = self._clock()
        self._apply_health(self.health.mark(gpu, healthy, reason, now, kind=FaultKind.MANUAL), now)

    def observe(
        self, running: list[JobRecord], usage: dict[str, dict[int, int]], external: dict[int, int], now: float
    ) -> None:
        """A monitor pass's memory readings (per job and outside gpuslice), then telemetry, if any."""
        self.usage, self.external = usage, external
        if self.telemetry is not None:
            self._read_telemetry(running, now)

    def forget(self, job_id: str) -> None:
        """A job ended: its memory readings go."""
        self.usage.pop(job_id, None)

    def _read_telemetry(self, running: list[JobRecord], now: float) -> None:
        assert self.telemetry is not None
        loads = [
            SliceLoad(g, self._busy_share(job, g), active=not job.suspended)
            for job in running
            for g in job.gpus
        ]
        memory_used = dict(self.external)
        for per_gpu in self.usage.values():
            for g, used in per_gpu.items():
                memory_used[g] = memory_used.get(g, 0) + used
        readings = self.telemetry.read(loads, memory_used)
        self.readings = {r.index: r for r in readings}
        for r in readings:
            for fault in r.faults:
                self._apply_health(self.health.mark(r.index, False, fault.reason, now, kind=fault.kind), now)
        self._detect_anomalies(running, readings, now)

    def _busy_share(self, job: JobRecord, gpu: int) -> float:
        """The part of a GPU's compute a job was given (the simulated utilisation model)."""
        spec = job.spec
        if job.mig is not None:
            model = self._machine.gpus[gpu].mig_model
            profile = mig_gpu(model).profile(str(job.mig["profile"]))
            return gpu_equivalent(1, mig_slices=profile.compute_slices)
        if not spec.is_share:
            return 1.0
        if spec.compute_percent:
            return spec.compute_percent / 100
        return spec.gpu_memory_bytes / self._machine.gpus[gpu].memory_bytes

    def _detect_anomalies(self, running: list[JobRecord], readings: list[GpuReading], now: float) -> None:
        k = len(_ANOMALY_METRICS)
        values = [float("nan")] * (k * self._machine.gpu_count)
        for r in readings:
            jobs = frozenset(j.id for j in running if r.index in j.gpus)
            if jobs != self._gpu_jobs[r.index]:  # a job came or went: an expected change; learn anew
                self._gpu_jobs[r.index] = jobs
                for m in range(k):
                    self.anomalies.reset(r.index * k + m)
            sample = (r.utilization_percent, r.memory_used_bytes, r.temperature_celsius)
            for m, v in enumerate(sample):
                if v is not None:
                    values[r.index * k + m] = float(v)
        for a in self.anomalies.update(values):
            g, metric = divmod(a.series, k)
            gpu, name = self._machine.gpus[g], _ANOMALY_METRICS[metric]
            self._metrics.anomaly(g, gpu.uuid, gpu.model, name)
            self._store.event(
                None, "anomaly", anomaly_text(g, name, a.value, a.mean, a.sigmas),
                now, {"gpu": g, "uuid": gpu.uuid, "metric": name, "value": a.value, "mean": a.mean,
                      "std": a.std},
            )  # fmt: skip

    def _apply_health(self, change: HealthChange | None, now: float) -> None:
        """Make a health change take effect: the scheduler, the event log, the fault counter."""
        if change is None:
            return
        g, after = change.gpu, change.after
        gpu = self._machine.gpus[g]
        self._scheduler().set_gpu_health(g, after.healthy, after.reason)
        on_it = [job for job, gpus in self._scheduler().running().items() if g in gpus]
        detail = {"gpu": g, "uuid": gpu.uuid, "healthy": after.healthy, "reason": after.reason,
                  "kind": after.kind, "jobs": on_it}  # fmt: skip
        if after.healthy:
            text = f"GPU {g} is healthy again (was: {change.before.reason}); it takes new jobs"
        else:
            self._metrics.fault(g, gpu.uuid, gpu.model, after.kind)
            text = f"GPU {g} is unhealthy: {after.reason}; no new jobs go there"
            if on_it:
                text += f"; jobs running on it: {', '.join(on_it)}"
        with self._store.transaction():
            since = after.since or now
            self._store.put_gpu_health(g, gpu.uuid, after.healthy, after.reason, after.kind, since)
            self._store.event(None, "gpu-health", text, now, detail)
            if not after.healthy:
                for job in on_it:
                    self._store.event(
                        job, "gpu-health",
                        f"GPU {g}, which this job runs on, is unhealthy ({after.reason}); the job keeps "
                        "running, but its results may be wrong",
                        now, {"gpu": g, "uuid": gpu.uuid, "reason": after.reason, "kind": after.kind},
                    )  # fmt: skip
        _log.warning("%s", text)
        self._wake.set()
