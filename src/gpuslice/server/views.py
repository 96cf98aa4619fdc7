"""What the API and the metrics read of the serve daemon: GPU rows, the metrics snapshot, tenants.

``Daemon`` holds one ``DaemonViews``. ``gpus`` and ``tenants`` answer API calls; ``snapshot`` answers every
``GET /metrics`` scrape from the GPU state published at the end of the last tick, without the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import gpuslice
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import mig_gpu
from gpuslice.node.telemetry import GpuReading
from gpuslice.observe.health import GpuHealth
from gpuslice.observe.metrics import GpuState, PendingState, ServeSnapshot, SliceState
from gpuslice.scheduler.node_scheduler import GpuUsage, MigAssignment, NodeScheduler
from gpuslice.scheduler.reasons import PendingReason
from gpuslice.server.errors import TenantNotFound
from gpuslice.server.gpu_health import GpuWatch
from gpuslice.server.store import JobRecord, Store, TenantRecord
from gpuslice.workload.equivalent import gpu_equivalent
from gpuslice.workload.job import DEFAULT_TENANT, JobSpec, JobState, Priority

__all__ = ["DaemonViews", "GpuSnapshot", "memory_limit"]


class GpuSnapshot(NamedTuple):
    """What the GPU rows are made of, copied under the daemon's lock so they can be read without it."""

    usage: list[GpuUsage]
    running: dict[str, tuple[JobSpec, MigAssignment | None]]
    measured: dict[str, dict[int, int]]
    external: dict[int, int]
    readings: dict[int, GpuReading]
    health: list[GpuHealth]


class DaemonViews:
    """The read side of the serve daemon: rows for ``GET /v1/gpus`` and ``/v1/tenants``, the metrics.

    Owns what was published at the end of the last tick (the GPU state, why each pending job waits, the
    job counts), so that readers never wait for a scheduling pass. ``lock`` is the daemon's; ``scheduler``
    gives its scheduler of the moment; ``watch`` holds the measured memory, readings and health.
    """

    def __init__(
        self,
        machine: Machine,
        store: Store,
        node: Any,
        watch: GpuWatch,
        *,
        scheduler: Callable[[], NodeScheduler],
        sharing: str,
        simulated: bool,
        lock: threading.RLock,
        clock: Callable[[], float],
    ) -> None:
        self._machine = machine
        self._store = store
        self._node = node
        self._watch = watch
        self._scheduler = scheduler
        self._sharing = sharing
        self._simulated = simulated
        self._lock = lock
        self._clock = clock
        self._published: GpuSnapshot | None = None  # GPU state at the end of the last tick (metrics)
        self._waiting: dict[str, PendingReason] = {}  # why each pending job waits, as of the last tick
        self.job_counts: dict[str, int] = {}  # jobs per state as of the last pass (``publish_counts``)
        self.publish_counts()

    def publish_counts(self) -> None:
        """Count jobs per state for ``/v1/health``, which reads them from memory: a health check never
        waits on the state file (another process may hold its lock, its disk may fail)."""
        self.job_counts = {state.value: n for state, n in self._store.counts().items()}

    def publish(self, *, gpus: bool = True) -> None:
        """What readers see from now on: why each job waits and (``gpus``) the GPU state. Call with the
        lock held, at the end of a pass or after a change the readers must see at once."""
        if gpus:
            self._published = self._gpu_state()
        self._waiting = dict(self._scheduler().waiting())

    def gpus(self) -> list[dict[str, Any]]:
        with self._lock:
            state = self._gpu_state()
        return self._gpu_rows(state)

    def _gpu_state(self) -> GpuSnapshot:
        """What the GPU rows are made of, copied (call with the lock held). The scheduler holds every
        running job's spec: no store read, and no JSON decode, per call."""
        scheduler, watch = self._scheduler(), self._watch
        return GpuSnapshot(
            scheduler.gpu_usage(),
            scheduler.running_specs(),
            {job: dict(per_gpu) for job, per_gpu in watch.usage.items()},
            dict(watch.external),
            dict(watch.readings),
            [watch.health[g] for g in range(self._machine.gpu_count)],
        )

    def _gpu_rows(self, state: GpuSnapshot) -> list[dict[str, Any]]:
        usage, running, measured, external, readings, healths = state
        rows = []
        for gpu in usage:
            jobs = []
            for job_id in gpu.job_ids:
                spec, mig = running[job_id]
                share = spec.is_share
                memory, compute = (
                    (spec.gpu_memory_bytes, spec.compute_percent) if share else (gpu.memory_total_bytes, 100)
                )
                if mig is not None and spec.mig_profile:  # an instance holds its slices, not the GPU
                    profile = mig_gpu(self._machine.gpus[gpu.index].mig_model).profile(mig.profile)
                    memory = profile.memory_bytes
                    compute = round(100 * gpu_equivalent(1, mig_slices=profile.compute_slices))
                jobs.append(
                    {
                        "id": job_id,
                        "memory_bytes": memory,
                        "compute_percent": compute,
                        "mig": mig.profile if mig is not None and spec.mig_profile else "",
                        "used_memory_bytes": measured.get(job_id, {}).get(gpu.index),
                        "tenant": spec.tenant,
                    }
                )
            health = healths[gpu.index]
            reading = readings.get(gpu.index)
            rows.append(
                {
                    "index": gpu.index,
                    "uuid": self._machine.gpus[gpu.index].uuid,
                    "model": gpu.model,
                    "memory_total_bytes": gpu.memory_total_bytes,
                    "memory_free_bytes": gpu.memory_free_bytes,
                    "compute_free_percent": gpu.compute_free_milli / 10,
                    "external_memory_bytes": max(gpu.external_bytes, external.get(gpu.index, 0)),
                    "jobs": jobs,
                    "healthy": health.healthy,
                    "unhealthy_reason": health.reason or None,
                    "utilization_percent": reading.utilization_percent if reading else None,
                    "temperature_celsius": reading.temperature_celsius if reading else None,
                    "power_watts": reading.power_watts if reading else None,
                    "memory_used_bytes": reading.memory_used_bytes if reading else None,
                }
            )
        return rows

    def snapshot(self) -> ServeSnapshot:
        """The state the metrics show (``GET /metrics`` calls this at every scrape). GPUs and slices are
        as of the end of the last tick, published without the lock: a scrape never waits for a
        scheduling pass (hundreds of pending jobs make one take tens of ms). The queue is read now."""
        published = self._published  # None before the first tick
        rows = self.gpus() if published is None else self._gpu_rows(published)
        now = self._clock()
        gpus = [
            GpuState(
                index=r["index"], uuid=r["uuid"], model=r["model"],
                memory_total_bytes=r["memory_total_bytes"],
                memory_allocated_bytes=sum(j["memory_bytes"] for j in r["jobs"]),
                healthy=r["healthy"], utilization_percent=r["utilization_percent"],
                memory_used_bytes=r["memory_used_bytes"], temperature_celsius=r["temperature_celsius"],
                power_watts=r["power_watts"],
            )
            for r in rows
        ]  # fmt: skip
        slices = [
            SliceState(
                job=j["id"], tenant=j["tenant"], gpu=r["index"], memory_allocated_bytes=j["memory_bytes"],
                compute_allocated_ratio=j["compute_percent"] / 100, memory_used_bytes=j["used_memory_bytes"],
            )
            for r in rows
            for j in r["jobs"]
        ]  # fmt: skip
        pending = [
            PendingState(tenant, Priority(priority).name.lower(), jobs, max(0.0, now - since))
            for tenant, priority, jobs, since in self._store.pending_groups()
        ]
        info = {
            "version": gpuslice.__version__,
            "machine": self._machine.name,
            "sharing": self._sharing,
            "simulated": "true" if self._simulated else "false",
        }
        counts = {state.value: n for state, n in self._store.counts().items()}
        return ServeSnapshot(gpus, slices, pending, counts, info)

    def tenants(self) -> list[dict[str, Any]]:
        """Every tenant stored, with active jobs, or the default: settings, quotas and usage now. GPUs
        in use count as the quotas count them (``scheduler/quota.py``: a share the larger of its memory
        and compute fractions of its GPU), read from the scheduler that enforces them."""
        stored = self._store.tenants()
        active = self._store.jobs([JobState.PENDING, JobState.RUNNING])
        with self._lock:
            usage = self._scheduler().tenant_usage()
            never = self._scheduler().never_runs()
        names = sorted(set(stored) | {j.spec.tenant for j in active} | {DEFAULT_TENANT})
        rows = []
        for name in names:
            t = stored.get(name, TenantRecord(name))
            mine = [j for j in active if j.spec.tenant == name]
            gpus, memory = usage.get(name, (0.0, 0))
            rows.append(
                {
                    "name": name,
                    "weight": t.weight,
                    "max_gpus": t.max_gpus,
                    "max_gpu_memory_bytes": t.max_gpu_memory_bytes,
                    "response": {**self._node.response_defaults(), **t.response},
                    "running_jobs": sum(1 for j in mine if j.state is JobState.RUNNING),
                    "pending_jobs": sum(1 for j in mine if j.state is JobState.PENDING),
                    "gpus_in_use": round(gpus, 3),
                    "gpu_memory_in_use_bytes": memory,
                    "never_fit_jobs": sorted((j.id for j in mine if j.id in never), key=_job_number),
                }
            )
        return rows

    def pending_reasons(self) -> dict[str, PendingReason]:
        """Why each pending job waits (the scheduler's reason; the stored one only says how it entered the
        queue), as of the last tick: a job list never waits for a scheduling pass."""
        return self._waiting

    def tenant(self, name: str) -> dict[str, Any]:
        """One row of ``tenants``; TenantNotFound for a name that is neither set nor used."""
        rows = self.tenants()
        for row in rows:
            if row["name"] == name:
                return row
        known = ", ".join(r["name"] for r in rows)
        raise TenantNotFound(
            f"no tenant {name!r} (known: {known}); `gpuslice tenants set {name} …` creates one"
        )


def _job_number(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (0, job_id)


def memory_limit(machine: Machine, job: JobRecord) -> int:
    """GPU memory a job may hold on each of its GPUs: its slice, its MIG instance's, or the whole GPU."""
    if job.spec.is_share:
        return job.spec.gpu_memory_bytes
    if job.mig is not None:
        return int(job.mig.get("memory_bytes", 0))
    return min((machine.gpus[g].memory_bytes for g in job.gpus), default=0)
