"""The serve loop: scheduler decisions become processes, process exits become job states.

```text
tick (every tick_seconds, or at once after a submit/cancel):
    exits     node.poll(job)            -> finished: SUCCEEDED | FAILED | CANCELLED | PREEMPTED -> PENDING,
              supervisor gone, no exit  -> FAILED "lost"; restart policy may requeue (FAILED -> PENDING)
    limits    max_runtime passed        -> node.terminate(grace) ; FAILED "exceeded max runtime" at exit
    monitor   node.usage(jobs)          -> scheduler.set_external_usage(gpu, bytes) for foreign processes
              graded response per job   -> warn event | node.suspend | node.kill ; FAILED at exit
    telemetry telemetry.read(loads)     -> per-GPU utilisation, memory, temperature, power (NVML or the
                                           simulated model); faults -> GPU unhealthy; 3-sigma anomalies
    decide    scheduler.step(now)       -> StartJob: store RUNNING (GPUs) *then* node.launch, then pid
                                        -> PreemptJob: node.terminate(grace); PREEMPTED -> PENDING at exit
health (an NVML fault, or set_gpu_health from the API):
    GPU unhealthy -> scheduler.set_gpu_health (no new jobs there), an event for the GPU and one per job
                     running on it (they keep running), gpuslice_gpu_faults_total
recover (once, before the first tick, e.g. after kill -9 of the server):
    RUNNING with a live supervisor (same pid + start time) or an exit file -> scheduler.adopt; the next
        tick reads the exit file as usual
    RUNNING with neither                 -> FAILED "lost while the server was down", requeued per policy
    PENDING                              -> scheduler.submit again, in submission order
```

The store is written before any irreversible act: a job is RUNNING with its GPUs before its process
exists, so a crash between the two leaves a RUNNING job whose supervisor is found by its job directory
(or, if it never started, is lost and requeued). Every public method takes one lock; the API calls them
from its worker threads and the loop from its own, so the daemon is the only writer to the store.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import gpuslice
from gpuslice.errors import InvalidRequest
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import mig_gpu
from gpuslice.node.enforcement import DEFAULT_SHARING
from gpuslice.node.launcher import ExitStatus, LaunchedJob
from gpuslice.node.mig_manager import MigCommandFailed
from gpuslice.node.telemetry import GpuReading, SliceLoad, Telemetry
from gpuslice.observe.anomaly import SigmaDetector
from gpuslice.observe.health import GpuHealth, HealthBook, HealthChange
from gpuslice.observe.metrics import GpuState, PendingState, ServeMetrics, ServeSnapshot, SliceState
from gpuslice.policies.queue import DEFAULT_QUEUE_POLICY
from gpuslice.policies.queue import queue_policy as lookup_queue_policy
from gpuslice.programs.guard import GuardConfig
from gpuslice.programs.loader import LoadedPolicy, PolicyFamilyMismatch, is_policy_path, load_file
from gpuslice.programs.maps import MAP_TYPES, Map
from gpuslice.programs.slot import PolicySlot
from gpuslice.scheduler.node_scheduler import (
    GpuUsage,
    MigAssignment,
    NodeScheduler,
    PreemptJob,
    StartJob,
    TenantQuota,
)
from gpuslice.server.errors import GpuNotFound, JobConflict, PolicyNotFound
from gpuslice.server.store import JobRecord, Store, TenantRecord
from gpuslice.units import format_size
from gpuslice.workload.job import DEFAULT_GRACE_SECONDS, JobSpec, JobState, Priority, RestartPolicy

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_TICK_SECONDS",
    "Daemon",
    "NodeOps",
    "RecoveryReport",
    "anomaly_text",
]

_log = logging.getLogger("gpuslice.server")

# How often the loop runs when nothing wakes it (a submit, a cancel or an exit wakes it at once).
DEFAULT_TICK_SECONDS = 0.2
# The supervisor sends the SIGKILL after the grace; if the group still lives this much later (the
# supervisor itself died), the daemon kills it.
_KILL_SLACK_SECONDS = 5.0
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


class NodeOps(Protocol):
    """What the daemon asks of the node (``gpuslice.node``); tests pass a fake with the same methods."""

    def launch(self, job_id: str, spec: JobSpec, env: Mapping[str, str], state_dir: Path) -> LaunchedJob: ...
    def poll(self, job_id: str, state_dir: Path) -> ExitStatus | None: ...
    def is_alive(self, pid: int, start_time: float) -> bool: ...
    def find_supervisor(self, job_id: str, state_dir: Path) -> LaunchedJob | None: ...
    def terminate(self, pgid: int, grace_seconds: float) -> bool: ...
    def suspend(self, pgid: int) -> bool: ...
    def resume(self, pgid: int) -> bool: ...
    def kill(self, pgid: int) -> bool: ...
    def job_env(self, spec: JobSpec, gpus: tuple[int, ...], mig: MigAssignment | None) -> dict[str, str]: ...
    def usage(self, jobs: Mapping[str, int]) -> tuple[dict[str, dict[int, int]], dict[int, int]]: ...
    def respond(
        self, job_id: str, tenant: TenantRecord | None, used: int, limit: int, now: float
    ) -> tuple[str, str] | None: ...
    def check_response(self, settings: Mapping[str, Any]) -> None: ...
    def response_defaults(self) -> dict[str, Any]: ...
    def forget(self, job_id: str) -> None: ...


@dataclass
class RecoveryReport:
    """What ``recover`` found, by job id: re-adopted, read from their exit file later, lost, requeued."""

    adopted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


class Daemon:
    """The one writer of the store; owns the scheduler and the node. Thread-safe (one lock)."""

    def __init__(
        self,
        store: Store,
        machine: Machine,
        node: NodeOps,
        state_dir: Path,
        *,
        sharing: str = DEFAULT_SHARING.value,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        queue_policy: str = DEFAULT_QUEUE_POLICY,
        guard: GuardConfig | None = None,
        tick_seconds: float = DEFAULT_TICK_SECONDS,
        monitor_seconds: float = 0.5,
        simulated: bool = False,
        clock: Callable[[], float] = time.time,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.store = store
        self.machine = machine
        self.node = node
        self.state_dir = Path(state_dir)
        self.sharing = sharing
        self.grace_seconds = grace_seconds
        self.tick_seconds = tick_seconds
        # A monitor pass reads every job's GPU memory (NVML or report files, ~20 ms); it runs at most this
        # often, so a burst of submits (each wakes the loop) does not queue behind it.
        self.monitor_seconds = monitor_seconds
        self._monitored_at = float("-inf")
        self.simulated = simulated
        self.user = getpass.getuser()
        self.clock = clock
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Policies as programs (issue 9): the queue policy the scheduler calls is the slot's current one,
        # a built-in or a guarded file swapped in while serving. Guard events (fault, detached, …) come
        # from inside a scheduling pass; they are queued and written to the store by the lock holder.
        self._policy_events: deque[tuple[str, str]] = deque()
        builtin = DEFAULT_QUEUE_POLICY if is_policy_path(queue_policy) else queue_policy
        self.policy_slots = {
            "queue": PolicySlot(
                "queue",
                lookup_queue_policy(builtin),
                guard or GuardConfig(),
                on_event=lambda message: self._policy_events.append(("queue", message)),
            )
        }
        if is_policy_path(queue_policy):  # serve --queue-policy FILE: loaded as if by `policy load`
            self.policy_slots["queue"].swap(load_file(queue_policy))
        # GPU health marks outlive a restart (an XID'd GPU must not take jobs again because the server
        # restarted); a mark is kept only for the GPU it was made for (same index and UUID).
        self.health = HealthBook(machine.gpu_count)
        for g, uuid, healthy, reason, kind, since in store.gpu_health():
            if not healthy and g < machine.gpu_count and machine.gpus[g].uuid == uuid:
                self.health.restore(g, GpuHealth(False, reason, kind, since))
        self.scheduler = self._new_scheduler()
        self._usage: dict[str, dict[int, int]] = {}  # job -> GPU -> bytes, from the last monitor pass
        self._external: dict[int, int] = {}
        self.telemetry = telemetry  # None: no GPU readings (tests with a fake node)
        self._readings: dict[int, GpuReading] = {}  # GPU -> the last telemetry reading
        self._gpu_jobs: list[frozenset[str]] = [frozenset()] * machine.gpu_count
        self.anomalies = SigmaDetector(
            len(_ANOMALY_METRICS) * machine.gpu_count,
            min_std=[
                floor * (g.memory_bytes if name == "memory_used" else 1)
                for g in machine.gpus
                for name, floor in zip(_ANOMALY_METRICS, _ANOMALY_MIN_STD, strict=True)
            ],
        )
        self._published: _GpuState | None = None  # GPU state at the end of the last tick (metrics)
        self.metrics = ServeMetrics(self.snapshot)

    def _new_scheduler(self) -> NodeScheduler:
        scheduler = NodeScheduler(
            self.machine, tenants=_quotas(self.store.tenants()), grace_seconds=self.grace_seconds
        )
        scheduler.policy = self.policy_slots["queue"].current
        for g, health in self.health.unhealthy().items():
            scheduler.set_gpu_health(g, False, health.reason)
        return scheduler

    # -- API side -------------------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobRecord:
        """Store a new job and queue it; InvalidRequest (nothing stored) if it can never run here."""
        with self._lock:
            now = self.clock()
            with self.store.transaction():
                job = self.store.add_job(spec, now)
                self.scheduler.submit(job.id, spec, now)  # raises before the commit: nothing half-applied
            self._wake.set()
            return job

    def submit_once(self, spec: JobSpec, key: tuple[str, str] | None) -> tuple[JobRecord, bool]:
        """``submit`` under an idempotency key (key, digest of the body): the job a previous submit with
        that key made, or a new one stored together with the key. Returns (job, created)."""
        if key is None:
            return self.submit(spec), True
        with self._lock:
            found = self.store.job_for_key(*key)
            if found is not None:
                return found, False
            with self.store.transaction():
                job = self.submit(spec)
                self.store.remember_key(key[0], key[1], job.id)
            return job, True

    def cancel(self, job_id: str) -> JobRecord:
        """Cancel a pending job now; stop a running one (SIGTERM, grace, SIGKILL): CANCELLED at its exit."""
        with self._lock:
            job = self.store.get(job_id)
            now = self.clock()
            if job.state is JobState.PENDING:
                self.scheduler.cancel(job_id)
                return self.store.transition(job_id, JobState.CANCELLED, "cancelled by user", now)
            if job.state is not JobState.RUNNING:
                raise JobConflict(
                    f"job {job_id} is {job.state.value}; only pending or running jobs can be cancelled"
                )
            if job.stop == "cancel":
                return job
            self._stop_job(job, "cancel", self.grace_seconds, "cancel requested by user", now)
            return self.store.get(job_id)

    def set_tenant(self, tenant: TenantRecord) -> None:
        """Store a tenant's weight, quotas and graded response; the scheduler uses them from the next step."""
        self.node.check_response(tenant.response)
        with self._lock:
            self.store.put_tenant(tenant, self.clock())
            self.scheduler.tenants = _quotas(self.store.tenants())
            self._wake.set()

    def set_gpu_health(self, gpu: int, healthy: bool, reason: str) -> None:
        """Mark a GPU unhealthy by hand (a fault injected on a simulated GPU, or an operator draining a
        real one) or healthy again; GpuNotFound when there is no such GPU."""
        if not 0 <= gpu < self.machine.gpu_count:
            raise GpuNotFound(f"no GPU {gpu}; this machine has GPU 0–{self.machine.gpu_count - 1}")
        with self._lock:
            now = self.clock()
            self._apply_health(self.health.mark(gpu, healthy, reason, now, manual=True), now)
            self._published = self._gpu_state()  # the metrics show it at once, not after the next tick

    def queue(self) -> list[tuple[JobRecord, str]]:
        with self._lock:
            order = self.scheduler.queue()
        jobs = {j.id: j for j in self.store.jobs([JobState.PENDING])}
        return [(jobs[i], reason) for i, reason in order if i in jobs]

    def gpus(self) -> list[dict[str, Any]]:
        with self._lock:
            state = self._gpu_state()
        return self._gpu_rows(state)

    def _gpu_state(self) -> _GpuState:
        """What the GPU rows are made of, copied (call with the lock held). The scheduler holds every
        running job's spec: no store read, and no JSON decode, per call."""
        return _GpuState(
            self.scheduler.gpu_usage(),
            self.scheduler.running_specs(),
            {job: dict(per_gpu) for job, per_gpu in self._usage.items()},
            dict(self._external),
            dict(self._readings),
            [self.health[g] for g in range(self.machine.gpu_count)],
        )

    def _gpu_rows(self, state: _GpuState) -> list[dict[str, Any]]:
        usage, running, measured, external, readings, healths = state
        rows = []
        for gpu in usage:
            jobs = []
            for job_id in gpu.job_ids:
                spec, mig = running[job_id]
                share = spec.is_share
                jobs.append(
                    {
                        "id": job_id,
                        "memory_bytes": spec.gpu_memory_bytes if share else gpu.memory_total_bytes,
                        "compute_percent": spec.compute_percent if share else 100,
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
                    "uuid": self.machine.gpus[gpu.index].uuid,
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
        now = self.clock()
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
            for tenant, priority, jobs, since in self.store.pending_groups()
        ]
        info = {
            "version": gpuslice.__version__,
            "machine": self.machine.name,
            "sharing": self.sharing,
            "simulated": "true" if self.simulated else "false",
        }
        counts = {state.value: n for state, n in self.store.counts().items()}
        return ServeSnapshot(gpus, slices, pending, counts, info)

    def tenants(self) -> list[dict[str, Any]]:
        stored = self.store.tenants()
        active = self.store.jobs([JobState.PENDING, JobState.RUNNING])
        names = sorted(set(stored) | {j.spec.tenant for j in active} | {"default"})
        rows = []
        for name in names:
            t = stored.get(name, TenantRecord(name))
            running = [j for j in active if j.spec.tenant == name and j.state is JobState.RUNNING]
            rows.append(
                {
                    "name": name,
                    "weight": t.weight,
                    "max_gpus": t.max_gpus,
                    "max_gpu_memory_bytes": t.max_gpu_memory_bytes,
                    "response": {**self.node.response_defaults(), **t.response},
                    "running_jobs": len(running),
                    "pending_jobs": sum(
                        1 for j in active if j.spec.tenant == name and j.state is JobState.PENDING
                    ),
                    "gpus_in_use": round(sum(_gpus_held(j) for j in running), 3),
                    "gpu_memory_in_use_bytes": sum(self._memory_held(j) for j in running),
                }
            )
        return rows

    def log_path(self, job_id: str, stream: str) -> Path:
        return self.state_dir / "jobs" / job_id / f"{stream}.log"

    # -- policies as programs (issue 9) ---------------------------------------------------------------
    # The scheduler's policy is only assigned under the daemon's lock, which a scheduling pass holds
    # from start to end, and map writes take it too: a swap, an unload or a map write lands between two
    # passes, never inside one (no pass orders half its jobs with one policy and half with the next).

    def policies(self) -> list[dict[str, Any]]:
        """Each family's slot as the API shows it (``PolicyOut``): what runs, its faults, its maps."""
        with self._lock:
            self._flush_policy_events(self.clock())
            return [_policy_out(slot.info()) for slot in self.policy_slots.values()]

    def load_policy(self, loaded: LoadedPolicy) -> dict[str, Any]:
        """Swap a verified policy in for its family; maps of the same name and spec keep their entries."""
        if loaded.family not in self.policy_slots:
            raise PolicyFamilyMismatch(
                f"{loaded.path} is a {loaded.family} policy; this server runs {', '.join(self.policy_slots)} "
                "policies (placement and memory policies load into sim openb, memsim and the Kubernetes "
                "extender with --policy FILE)"
            )
        slot = self.policy_slots[loaded.family]
        # The slot builds the new instance (maps, __init__) before it assigns: a failure changes nothing.
        # The scheduler takes the new one under the daemon's lock, so the pass in progress ends with the
        # policy it started with.
        slot.swap(loaded)
        with self._lock:
            self.scheduler.policy = slot.current
            self._flush_policy_events(self.clock())
            self._wake.set()
            return _policy_out(slot.info())

    def unload_policy(self, family: str) -> dict[str, Any]:
        """Back to the family's built-in policy; NoPolicyLoaded when it runs already."""
        slot = self._slot(family)
        slot.unload()
        with self._lock:
            self.scheduler.policy = slot.current
            self._flush_policy_events(self.clock())
            self._wake.set()
            return _policy_out(slot.info())

    def policy_map(self, family: str, name: str) -> dict[str, Any]:
        """Every entry of one map of the loaded policy, sorted by key (``MapOut``)."""
        slot = self._slot(family)
        with self._lock:
            entries = slot.map_dump(name)  # NoPolicyLoaded / NoSuchMap first
            spec = _spec_out(slot.info()["maps"][name])
            return {"family": family, "name": name, **spec, "entries": entries}

    def policy_map_get(self, family: str, name: str, key: str) -> dict[str, Any]:
        """One entry (``MapEntryOut``); ``key`` is text, parsed as the map's key type."""
        slot = self._slot(family)
        with self._lock:
            value = slot.map_get(name, key)
            if value is None:  # map values are never None: the key is absent
                raise PolicyNotFound(f"map {name} has no key {key!r}; `policy map dump {name}` lists them")
            return {"family": family, "map": name, "key": _typed_key(slot, name, key), "value": value}

    def policy_map_update(self, family: str, name: str, key: str, value: Any) -> dict[str, Any]:
        """Write one entry; the policy reads it from the next pass on (``bpftool map update``). ``value``
        is text to parse as the map's value type, or a JSON number/bool of that type."""
        slot = self._slot(family)
        with self._lock:
            previous = slot.map_get(name, key)
            # MapError, and nothing written, for a key or value of another type than the map's
            slot.map_update(name, key, value)
            self._wake.set()
            return {"family": family, "map": name, "key": _typed_key(slot, name, key),
                    "value": slot.map_get(name, key), "previous": previous}  # fmt: skip

    def policy_map_delete(self, family: str, name: str, key: str) -> dict[str, Any]:
        """Remove one entry (``bpftool map delete``); PolicyNotFound when the key is not there."""
        slot = self._slot(family)
        with self._lock:
            previous = slot.map_get(name, key)
            if previous is None or not slot.map_delete(name, key):
                raise PolicyNotFound(f"map {name} has no key {key!r}; `policy map dump {name}` lists them")
            self._wake.set()
            return {"family": family, "map": name, "key": _typed_key(slot, name, key), "value": previous}

    def _slot(self, family: str) -> PolicySlot:
        slot = self.policy_slots.get(family)
        if slot is None:
            served = ", ".join(sorted(self.policy_slots))
            raise PolicyNotFound(f"this server runs no {family} policy; its policy families: {served}")
        return slot

    def _flush_policy_events(self, now: float) -> None:
        while self._policy_events:
            family, message = self._policy_events.popleft()
            self.store.event(None, "policy", message, now, {"family": family})

    # -- the loop -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Recover, then run the loop in a background thread until ``stop``."""
        self.recover()
        self._thread = threading.Thread(target=self._run, name="gpuslice-daemon", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop (jobs keep running under their supervisors; a restart re-adopts them)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a bug in one tick must not stop the queue; it is logged with its traceback
                _log.exception("daemon tick failed")
            self._wake.wait(self.tick_seconds)
            self._wake.clear()

    def tick(self) -> None:
        """One pass: exits, limits, monitor, then the scheduler's decisions."""
        with self._lock:
            now = self.clock()
            running = self.store.jobs([JobState.RUNNING])
            for job in running:
                self._check_exit(job, now)
            running = self.store.jobs([JobState.RUNNING])
            for job in running:
                self._check_limits(job, now)
            if now - self._monitored_at >= self.monitor_seconds:
                self._monitored_at = now
                self._monitor(running, now)
            # The guard detaches a faulty policy inside a pass; the slot then holds the default again.
            self.scheduler.policy = self.policy_slots["queue"].current
            for action in self.scheduler.step(now):
                if isinstance(action, StartJob):
                    self._launch(action, now)
                elif isinstance(action, PreemptJob):
                    self._preempt(action, now)
            self.metrics.pending_reasons(self.scheduler.queue())
            self._published = self._gpu_state()
            self._flush_policy_events(now)

    # -- recovery -------------------------------------------------------------------------------------

    def recover(self) -> RecoveryReport:
        """Rebuild the scheduler's picture from the store and the job directories (see module doc)."""
        report = RecoveryReport()
        with self._lock:
            now = self.clock()
            self.scheduler = self._new_scheduler()
            for job in self.store.jobs([JobState.RUNNING]):
                job = self._find_process(job)
                alive = job.pid is not None and self.node.is_alive(job.pid, job.proc_start_time or 0.0)
                if alive or self._exit_record(job) is not None:
                    try:
                        self.scheduler.adopt(job.id, job.spec, job.gpus, job.started_at or now, _mig(job.mig))
                    except InvalidRequest as err:  # the machine changed under it (fewer GPUs, MIG off)
                        self._stop_job(job, "cancel", self.grace_seconds, f"cannot be re-adopted: {err}", now)
                        report.refused.append(job.id)
                        continue
                    self.store.event(job.id, "recovery", "re-adopted after a server restart", now)
                    report.adopted.append(job.id)
                    continue
                report.lost.append(job.id)
                self._kill_lost(job)
                if self._end(job, JobState.FAILED, "lost while the server was down", now, None, requeue=True):
                    report.requeued.append(job.id)
            for job in self.store.jobs([JobState.PENDING]):
                if job.id in report.requeued:  # _end queued it already
                    continue
                try:
                    self.scheduler.submit(job.id, job.spec, job.submitted_at)
                except InvalidRequest as err:
                    self.store.transition(job.id, JobState.CANCELLED, f"can no longer run here: {err}", now)
                    report.refused.append(job.id)
        return report

    def _find_process(self, job: JobRecord) -> JobRecord:
        """A RUNNING job stored without a pid (the server died mid-launch): look for its supervisor."""
        if job.pid is not None:
            return job
        found = self.node.find_supervisor(job.id, self.state_dir)
        if found is None:
            return job
        return self.store.update(job.id, pid=found.pid, pgid=found.pgid, proc_start_time=found.start_time)

    # -- starting and stopping ------------------------------------------------------------------------

    def _launch(self, action: StartJob, now: float) -> None:
        job = self.store.get(action.job_id)
        self.metrics.started(job.spec.priority.name.lower(), now - _queued_since(job))
        gpus_text = ",".join(map(str, action.gpus))
        where = f"MIG {action.mig.profile} on GPU {action.mig.gpu}" if action.mig else f"GPU {gpus_text}"
        mig = None
        if action.mig is not None:
            profile = mig_gpu(self.machine.gpus[action.mig.gpu].mig_model).profile(action.mig.profile)
            mig = {"gpu": action.mig.gpu, "profile": profile.name, "start": action.mig.start,
                   "memory_bytes": profile.memory_bytes}  # fmt: skip
        job = self.store.transition(
            job.id, JobState.RUNNING, f"started on {where}", now,
            {"gpus": list(action.gpus), "attempt": job.attempts + 1},
            gpus=action.gpus, mig=mig, started_at=now, finished_at=None, pid=None, pgid=None,
            proc_start_time=None, exit_code=None, exit_signal=None, attempts=job.attempts + 1, stop="",
            stop_deadline=None, suspended=False,
        )  # fmt: skip
        try:
            env = self.node.job_env(job.spec, action.gpus, action.mig)
            launched = self.node.launch(job.id, job.spec, env, self.state_dir)
        except Exception as err:  # the job cannot start (bad cwd, no MPS, …): it fails, the loop goes on
            _log.exception("launch of job %s failed", job.id)
            if isinstance(err, MigCommandFailed):  # the command and what it printed, for the operator
                self.store.event(job.id, "mig", str(err), now, err.details)
            self._end(job, JobState.FAILED, f"could not launch: {err}", now, None, requeue=False)
            return
        self.store.update(job.id, pid=launched.pid, pgid=launched.pgid, proc_start_time=launched.start_time)

    def _preempt(self, action: PreemptJob, now: float) -> None:
        job = self.store.get(action.job_id)
        if job.state is not JobState.RUNNING or job.stop:
            return
        reason = f"preempted for job {action.for_job}: SIGTERM, SIGKILL after {action.grace_seconds:g} s"
        self.metrics.preempted(job.spec.tenant, job.spec.priority.name.lower())
        self._stop_job(job, "preempt", action.grace_seconds, reason, now)

    def _stop_job(self, job: JobRecord, why: str, grace: float, reason: str, now: float) -> None:
        with self.store.transaction():
            self.store.update(job.id, stop=why, stop_deadline=now + grace)
            self.store.event(job.id, "signal", reason, now, {"stop": why, "grace_seconds": grace})
        if job.pgid is not None:
            self.node.terminate(job.pgid, grace)

    # -- exits ----------------------------------------------------------------------------------------

    def _exit_record(self, job: JobRecord) -> ExitStatus | None:
        """The exit record of the job's current attempt. A record that started before this attempt is a
        previous attempt's (the server died after storing RUNNING, before the launch removed it): none."""
        status = self.node.poll(job.id, self.state_dir)
        if status is None or status.started_at is None or job.started_at is None:
            return status
        if status.started_at < job.started_at:
            _log.warning("job %s: ignoring the exit record of an earlier attempt", job.id)
            return None
        return status

    def _kill_lost(self, job: JobRecord) -> None:
        """SIGKILL what is left of a job whose supervisor is gone, before it is recorded as ended: its
        processes must never outlive the record that says they ended (nor run beside a restart)."""
        if job.pgid is not None:
            self.node.kill(job.pgid)

    def _check_exit(self, job: JobRecord, now: float) -> None:
        status = self._exit_record(job)
        if status is not None:
            self._finished(job, status, now)
            return
        if job.pid is None:
            job = self._find_process(job)
            if job.pid is None:  # launched by nobody: only possible after a crash mid-launch
                self._end(job, JobState.FAILED, "lost: its process never started", now, None, requeue=True)
            return
        if not self.node.is_alive(job.pid, job.proc_start_time or 0.0):
            # The supervisor writes exit.json before it exits; read once more in case it just did.
            status = self._exit_record(job)
            if status is not None:
                self._finished(job, status, now)
            else:
                self._kill_lost(job)
                self._end(job, JobState.FAILED, "lost: its supervisor died without an exit record", now, None,
                          requeue=True)  # fmt: skip
            return
        if job.stop and job.stop_deadline is not None and now > job.stop_deadline + _KILL_SLACK_SECONDS:
            self.node.kill(job.pgid or job.pid)

    def _finished(self, job: JobRecord, status: ExitStatus, now: float) -> None:
        code = f"exit code {status.exit_code}" + (f" (signal {status.signal})" if status.signal else "")
        fields = {"exit_code": status.exit_code, "exit_signal": status.signal}
        if job.stop == "cancel":
            self._end(job, JobState.CANCELLED, f"cancelled by user ({code})", now, fields, requeue=False)
        elif job.stop == "preempt":
            self._end(job, JobState.PREEMPTED, f"preempted ({code})", now, fields, requeue=True)
        elif job.stop == "limit":
            limit = job.spec.max_runtime_seconds or 0.0
            why = f"stopped at its max runtime of {limit:g} s ({code})"
            self._end(job, JobState.FAILED, why, now, fields, requeue=False)
        elif job.stop == "enforce":
            why = f"killed for exceeding its GPU memory slice ({code})"
            self._end(job, JobState.FAILED, why, now, fields, requeue=False)
        elif status.succeeded:
            self._end(job, JobState.SUCCEEDED, "exited 0", now, fields, requeue=True)
        else:
            self._end(job, JobState.FAILED, f"failed with {code}", now, fields, requeue=True)

    def _end(
        self,
        job: JobRecord,
        state: JobState,
        reason: str,
        now: float,
        fields: dict[str, Any] | None,
        *,
        requeue: bool,
    ) -> bool:
        """Move a running job to ``state``, release its GPUs, and requeue it if its policy says so.

        One transaction: the end state, and the PENDING that follows it when requeued. Returns whether
        the job was requeued."""
        again = _requeue_reason(job, state) if requeue else None
        if state is JobState.FAILED:
            self.metrics.job_failed(reason)
        with self.store.transaction():
            self.store.transition(job.id, state, reason, now, finished_at=now, stop="", stop_deadline=None,
                                  suspended=False, **(fields or {}))  # fmt: skip
            if again is not None:
                self.store.transition(job.id, JobState.PENDING, again, now)
        self.scheduler.finished(job.id)
        self.node.forget(job.id)
        self._usage.pop(job.id, None)
        if again is not None:
            with contextlib.suppress(InvalidRequest):  # it ran here before; it can run again
                self.scheduler.submit(job.id, job.spec, job.submitted_at)
        self._wake.set()
        return again is not None

    # -- limits and enforcement -----------------------------------------------------------------------

    def _check_limits(self, job: JobRecord, now: float) -> None:
        limit = job.spec.max_runtime_seconds
        if limit is None or job.stop or job.started_at is None or now < job.started_at + limit:
            return
        self._stop_job(job, "limit", self.grace_seconds, f"max runtime {limit:g} s reached: SIGTERM", now)

    def _monitor(self, running: list[JobRecord], now: float) -> None:
        pids = {j.id: j.pid for j in running if j.pid is not None}
        usage, external = self.node.usage(pids)
        self._usage, self._external = usage, external
        if self.telemetry is not None:
            self._read_telemetry(running, now)
        for gpu in range(self.machine.gpu_count):
            self.scheduler.set_external_usage(gpu, external.get(gpu, 0))
        tenants = self.store.tenants()
        for job in running:
            limit = self._memory_limit(job)
            used = max(usage.get(job.id, {}).values(), default=0)
            if limit <= 0 or job.pgid is None or job.stop in ("enforce", "cancel", "limit"):
                continue
            decision = self.node.respond(job.id, tenants.get(job.spec.tenant), used, limit, now)
            if decision is None:
                continue
            action, reason = decision
            self.metrics.enforced(action, job.spec.tenant)
            self.store.event(
                job.id, "enforcement", reason, now, {"action": action, "used": used, "limit": limit}
            )
            if action == "suspend" and not job.suspended:
                self.node.suspend(job.pgid)
                self.store.update(job.id, suspended=True)
            elif action == "resume" and job.suspended:
                self.node.resume(job.pgid)
                self.store.update(job.id, suspended=False)
            elif action == "kill":
                with self.store.transaction():
                    self.store.update(job.id, stop="enforce", stop_deadline=now)
                self.node.kill(job.pgid)

    # -- telemetry, health, anomalies ------------------------------------------------------------------

    def _read_telemetry(self, running: list[JobRecord], now: float) -> None:
        assert self.telemetry is not None
        loads = [
            SliceLoad(g, self._busy_share(job, g), active=not job.suspended)
            for job in running
            for g in job.gpus
        ]
        memory_used = dict(self._external)
        for per_gpu in self._usage.values():
            for g, used in per_gpu.items():
                memory_used[g] = memory_used.get(g, 0) + used
        readings = self.telemetry.read(loads, memory_used)
        self._readings = {r.index: r for r in readings}
        for r in readings:
            for fault in r.faults:
                self._apply_health(self.health.mark(r.index, False, fault, now, manual=False), now)
        self._detect_anomalies(running, readings, now)

    def _busy_share(self, job: JobRecord, gpu: int) -> float:
        """The part of a GPU's compute a job was given (the simulated utilisation model)."""
        spec = job.spec
        if job.mig is not None:
            model = self.machine.gpus[gpu].mig_model
            return mig_gpu(model).profile(str(job.mig["profile"])).compute_slices / 7
        if not spec.is_share:
            return 1.0
        if spec.compute_percent:
            return spec.compute_percent / 100
        return spec.gpu_memory_bytes / self.machine.gpus[gpu].memory_bytes

    def _detect_anomalies(self, running: list[JobRecord], readings: list[GpuReading], now: float) -> None:
        k = len(_ANOMALY_METRICS)
        values = [float("nan")] * (k * self.machine.gpu_count)
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
            gpu, name = self.machine.gpus[g], _ANOMALY_METRICS[metric]
            self.metrics.anomaly(g, gpu.uuid, gpu.model, name)
            self.store.event(
                None, "anomaly", anomaly_text(g, name, a.value, a.mean, a.sigmas),
                now, {"gpu": g, "uuid": gpu.uuid, "metric": name, "value": a.value, "mean": a.mean,
                      "std": a.std},
            )  # fmt: skip

    def _apply_health(self, change: HealthChange | None, now: float) -> None:
        """Make a health change take effect: the scheduler, the event log, the fault counter."""
        if change is None:
            return
        g, after = change.gpu, change.after
        gpu = self.machine.gpus[g]
        self.scheduler.set_gpu_health(g, after.healthy, after.reason)
        on_it = [job for job, gpus in self.scheduler.running().items() if g in gpus]
        detail = {"gpu": g, "uuid": gpu.uuid, "healthy": after.healthy, "reason": after.reason,
                  "kind": after.kind, "jobs": on_it}  # fmt: skip
        if after.healthy:
            text = f"GPU {g} is healthy again (was: {change.before.reason}); it takes new jobs"
        else:
            self.metrics.fault(g, gpu.uuid, gpu.model, after.kind)
            text = f"GPU {g} is unhealthy: {after.reason}; no new jobs go there"
            if on_it:
                text += f"; jobs running on it: {', '.join(on_it)}"
        with self.store.transaction():
            since = after.since or now
            self.store.put_gpu_health(g, gpu.uuid, after.healthy, after.reason, after.kind, since)
            self.store.event(None, "gpu-health", text, now, detail)
            if not after.healthy:
                for job in on_it:
                    self.store.event(
                        job, "gpu-health",
                        f"GPU {g}, which this job runs on, is unhealthy ({after.reason}); the job keeps "
                        "running, but its results may be wrong",
                        now, {"gpu": g, "uuid": gpu.uuid, "reason": after.reason, "kind": after.kind},
                    )  # fmt: skip
        _log.warning("%s", text)
        self._wake.set()

    def _memory_limit(self, job: JobRecord) -> int:
        """GPU memory a job may hold on each of its GPUs: its slice, or the whole GPU."""
        if job.spec.is_share:
            return job.spec.gpu_memory_bytes
        if job.mig is not None:
            return int(job.mig.get("memory_bytes", 0))
        return min((self.machine.gpus[g].memory_bytes for g in job.gpus), default=0)

    def _memory_held(self, job: JobRecord) -> int:
        return self._memory_limit(job) * max(1, len(job.gpus))


def _requeue_reason(job: JobRecord, state: JobState) -> str | None:
    """Why a job that just ended goes back to the queue, or None if it does not."""
    if state is JobState.PREEMPTED:
        return "requeued after preemption"
    restarts_done = max(0, job.attempts - 1)
    if restarts_done >= job.spec.max_restarts:
        return None
    policy = job.spec.restart
    if state is JobState.FAILED and policy in (RestartPolicy.ON_FAILURE, RestartPolicy.ALWAYS):
        return f"restart {restarts_done + 1} of {job.spec.max_restarts} ({policy.value})"
    if state is JobState.SUCCEEDED and policy is RestartPolicy.ALWAYS:
        return f"restart {restarts_done + 1} of {job.spec.max_restarts} (always)"
    return None


class _GpuState(NamedTuple):
    usage: list[GpuUsage]
    running: dict[str, tuple[JobSpec, MigAssignment | None]]
    measured: dict[str, dict[int, int]]
    external: dict[int, int]
    readings: dict[int, GpuReading]
    health: list[GpuHealth]


def _queued_since(job: JobRecord) -> float:
    """When a job last entered the queue: its submit, or the end of its previous attempt (requeued)."""
    if job.attempts and job.finished_at is not None:
        return job.finished_at
    return job.submitted_at


def _gpus_held(job: JobRecord) -> float:
    request = job.spec.request()
    return request.num_gpu * request.gpu_milli / 1000


def _quotas(tenants: Mapping[str, TenantRecord]) -> dict[str, TenantQuota]:
    return {
        name: TenantQuota(
            name, weight=t.weight, max_gpus=t.max_gpus, max_gpu_memory_bytes=t.max_gpu_memory_bytes
        )
        for name, t in tenants.items()
    }


def _spec_out(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A map's layout from the slot's ``info()`` (key, value, max_entries) in the API's names."""
    return {"key_type": spec["key"], "value_type": spec["value"], "max_entries": spec["max_entries"]}


def _typed_key(slot: PolicySlot, name: str, key: str) -> Any:
    """``key`` as the map stores it (the text "3" is the int 3 in an int-keyed map)."""
    spec = slot.info()["maps"][name]
    return Map(MAP_TYPES[spec["key"]], MAP_TYPES[spec["value"]], 1).parse_key(key)


def _policy_out(info: Mapping[str, Any]) -> dict[str, Any]:
    """A slot's ``info()`` in the API's shape (``PolicyOut``); the built-in has no file, faults or maps."""
    faults = []
    for hook_reason, n in sorted(info.get("faults", {}).items()):
        hook, _, reason = hook_reason.partition(":")
        faults.append({"hook": hook, "reason": reason, "count": n})
    return {
        "family": info["family"],
        "name": info["name"],
        "builtin": info["builtin"],
        "source": info.get("path"),
        "sha256": info.get("sha256"),
        "loaded_at": info.get("loaded_at"),
        "detached": info["detached"],
        "faults": faults,
        "maps": [
            {"name": name, **_spec_out(spec), "entries": spec["entries"]}
            for name, spec in sorted(info.get("maps", {}).items())
        ],
    }


def _mig(data: dict[str, Any] | None) -> MigAssignment | None:
    return None if data is None else MigAssignment(int(data["gpu"]), str(data["profile"]), int(data["start"]))
