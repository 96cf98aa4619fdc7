"""The serve loop: scheduler decisions become processes, process exits become job states.

```text
tick (every tick_seconds, or at once after a submit/cancel):
    exits     supervisor alive          -> still running, whatever files say (a job cannot end itself)
              supervisor gone: node.poll(job) -> SUCCEEDED | FAILED | CANCELLED | PREEMPTED -> PENDING,
              no exit record            -> FAILED "lost"; restart policy may requeue (FAILED -> PENDING)
              unreadable exit record    -> FAILED "lost" with why: one job's files never stop a pass
              never started             -> PENDING again, no attempt counted (crash before the launch)
    limits    max_runtime passed        -> node.terminate(grace) ; FAILED "exceeded max runtime" at exit
    monitor   node.usage(jobs)          -> scheduler.set_external_usage(gpu, bytes) for foreign processes
              graded response per job   -> warn event | node.suspend | node.kill ; FAILED at exit
    telemetry telemetry.read(loads)     -> per-GPU utilisation, memory, temperature, power (NVML or the
                                           simulated model); faults -> GPU unhealthy; 3-sigma anomalies
    decide    scheduler.step(now)       -> StartJob: store RUNNING (GPUs) *then* node.launch, then pid;
                                           a launch short of descriptors, memory or disk -> PENDING again
                                        -> PreemptJob: node.terminate(grace); PREEMPTED -> PENDING at exit
```

``Daemon`` is this loop, the API's entry points, and five collaborators, one module each, that share its
lock and store and reach its scheduler: ``server/lifecycle.py`` (a job's start, stop, exit, limits and
enforcement), ``server/recovery.py`` (once, before the first tick, e.g. after kill -9 of the server),
``server/gpu_health.py`` (telemetry, GPU health, anomalies, measured memory), ``server/policy_admin.py``
(policy files and their maps) and ``server/views.py`` (what the API and the metrics read). Each owns its
state; none reaches into another's.

The store is written before any irreversible act: a job is RUNNING with its GPUs before its process
exists, so a crash between the two leaves a RUNNING job whose supervisor is found by its job directory
(or, if it never started, goes back to the queue). Each job is handled on its own within a pass: an
error about one is logged and the pass goes on with the others. The scheduler and the store change
together or not at all: a submit whose commit fails (a full disk) is taken back from the scheduler too.
Every public method takes one lock; the API calls them
from its worker threads and the loop from its own, so the daemon is the only writer to the store.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuslice.hardware.machine import Machine
from gpuslice.node.enforcement import DEFAULT_SHARING
from gpuslice.node.telemetry import Telemetry
from gpuslice.observe.metrics import ServeMetrics
from gpuslice.policies import DEFAULT_PLACEMENT
from gpuslice.policies.queue import DEFAULT_QUEUE_POLICY
from gpuslice.programs.guard import GuardConfig
from gpuslice.scheduler.node_scheduler import (
    NodeScheduler,
    PreemptJob,
    StartJob,
    TenantQuota,
)
from gpuslice.server.errors import JobConflict, StoreUnavailable
from gpuslice.server.gpu_health import GpuWatch, anomaly_text
from gpuslice.server.lifecycle import JobLifecycle
from gpuslice.server.node_ops import NodeOps
from gpuslice.server.policy_admin import PolicyAdmin
from gpuslice.server.recovery import Recovery, RecoveryReport
from gpuslice.server.store import JobRecord, Store, TenantRecord
from gpuslice.server.views import DaemonViews
from gpuslice.workload.job import DEFAULT_GRACE_SECONDS, JobSpec, JobState
from gpuslice.workload.target import TargetWorkload

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


class Daemon:
    """The one writer of the store; owns the scheduler and the node. Thread-safe (one lock).

    Made of collaborators that share its lock, store and scheduler, each owning its own state:
    ``policy_admin`` (policy files and their maps), ``watch`` (telemetry, GPU health, measured memory),
    ``jobs`` (a job's life: launch, stop, exit, limits, enforcement), ``recovery`` (once, at start) and
    ``views`` (what the API and the metrics read). Those that reach the scheduler are given
    ``lambda: self.scheduler``: recovery makes a new one.
    """

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
        placement: str = DEFAULT_PLACEMENT,
        target: TargetWorkload | None = None,
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
        self.target = target
        self.policy_admin = PolicyAdmin(
            store, queue_policy=queue_policy, placement=placement, guard=guard or GuardConfig(),
            lock=self._lock, wake=self._wake, clock=clock, on_swap=self._use_queue_policy,
        )  # fmt: skip
        self.metrics = ServeMetrics(lambda: self.views.snapshot())
        current = self._current_scheduler
        self.watch = GpuWatch(machine, store, self.metrics, telemetry, scheduler=current, wake=self._wake,
                              clock=clock)  # fmt: skip
        self.scheduler = self._new_scheduler()
        self.jobs = JobLifecycle(
            store, machine, node, self.metrics, self.watch, scheduler=current, state_dir=self.state_dir,
            grace_seconds=grace_seconds, wake=self._wake,
        )  # fmt: skip
        self.recovery = Recovery(store, node, self.jobs, scheduler=current, state_dir=self.state_dir)
        self.views = DaemonViews(machine, store, node, self.watch, scheduler=current, sharing=sharing,
                                 simulated=simulated, lock=self._lock, clock=clock)  # fmt: skip

    def _current_scheduler(self) -> NodeScheduler:
        return self.scheduler

    def _use_queue_policy(self) -> None:
        """The scheduler calls the queue slot's policy of the moment (after a load, an unload, a detach)."""
        self.scheduler.policy = self.policy_admin.queue_policy

    def _new_scheduler(self) -> NodeScheduler:
        scheduler = NodeScheduler(
            self.machine,
            tenants=_quotas(self.store.tenants()),
            grace_seconds=self.grace_seconds,
            placement=self.policy_admin.placement_factory,
            target=self.target,
        )
        scheduler.policy = self.policy_admin.queue_policy
        for g, health in self.watch.health.unhealthy().items():
            scheduler.set_gpu_health(g, False, health.reason)
        return scheduler

    # -- API side -------------------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobRecord:
        """Store a new job and queue it; InvalidRequest (nothing stored) if it can never run here."""
        self.node.check_host_limits(spec)
        with self._lock:
            now = self.clock()
            with self.store.transaction():
                job = self.store.add_job(spec, now)
                self.scheduler.submit(job.id, spec, now)  # raises before the commit: nothing half-applied
                # a commit that fails after this (a full disk) takes the job back out of the queue too
                self.store.on_rollback(lambda: self.scheduler.cancel(job.id))
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
            self.jobs.stop(job, "cancel", self.grace_seconds, "cancel requested by user", now)
            if job.pid is not None and self.node.supervisor_stopped(job.pid):  # SIGSTOPped: it cannot act
                self.store.event(job_id, "signal", f"its supervisor (pid {job.pid}) is stopped, no answer: "
                                 "the job is stopping; its end is recorded when it comes", now)  # fmt: skip
            return self.store.get(job_id)

    def set_tenant(self, tenant: TenantRecord) -> None:
        """Store a tenant's weight, quotas and graded response; the scheduler uses them from the next step.
        A waiting job the new quota can never admit is kept, marked: its reason says so from now on and
        an event records it (the owner raises the quota or cancels the job; nothing drops it)."""
        self.node.check_response(tenant.response)
        with self._lock:
            now, before = self.clock(), dict(self.scheduler.tenants)
            with self.store.transaction():
                self.store.put_tenant(tenant, now)
                marked = self.scheduler.set_tenants(_quotas(self.store.tenants()))
                self.store.on_rollback(lambda: self.scheduler.set_tenants(before))
                self.recovery.record_never_runs(marked, now)
            self.views.publish(gpus=False)  # the marks show at once
            self._wake.set()

    def queue(self) -> list[tuple[JobRecord, str]]:
        with self._lock:
            order = self.scheduler.queue()
        jobs = {j.id: j for j in self.store.jobs([JobState.PENDING])}
        return [(jobs[i], reason) for i, reason in order if i in jobs]

    def set_gpu_health(self, gpu: int, healthy: bool, reason: str) -> None:
        """Mark a GPU unhealthy by hand, or healthy again (``GpuWatch.mark``); the metrics show it at
        once, not after the next tick."""
        with self._lock:
            self.watch.mark(gpu, healthy, reason)
            self.views.publish()

    def recover(self) -> RecoveryReport:
        """Rebuild the scheduler's picture from the store and the job directories (``Recovery``): on a
        new scheduler, so that a second call starts from the store again."""
        with self._lock:
            self.scheduler = self._new_scheduler()
            return self.recovery.run(self.clock())

    def log_path(self, job_id: str, stream: str) -> Path:
        return self.state_dir / "jobs" / job_id / f"{stream}.log"

    # -- the loop -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Recover, then run the loop in a background thread until ``stop``."""
        self.recover()
        self.views.publish_counts()
        self._thread = threading.Thread(target=self._run, name="gpuslice-daemon", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop (jobs keep running under their supervisors; a restart re-adopts them)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.policy_admin.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except StoreUnavailable:  # locked or failing: the store logs it once a minute; next pass retries
                with contextlib.suppress(StoreUnavailable):  # what the pass did commit, for /v1/health
                    self.views.publish_counts()
            except Exception:  # a bug in one tick must not stop the queue; it is logged with its traceback
                _log.exception("daemon tick failed")
            self._wake.wait(self.tick_seconds)
            self._wake.clear()

    def tick(self) -> None:
        """One pass: exits, limits, monitor, then the scheduler's decisions. While the state file is
        locked or failing, a probe write that waits for nobody comes first, and nothing else until it
        works: no decision can be stored, so none is made (StoreUnavailable ends the pass)."""
        with self._lock:
            if not self.store.condition.ok:
                self.store.probe()
            now = self.clock()
            for job in self.store.jobs([JobState.RUNNING]):
                self._each(self.jobs.check_exit, job, now)
            running = self.store.jobs([JobState.RUNNING])
            for job in running:
                self._each(self.jobs.check_limits, job, now)
            if now - self._monitored_at >= self.monitor_seconds:
                self._monitored_at = now
                self._monitor(running, now)
            # The guard detaches a faulty policy inside a pass; the slot then holds the default again.
            self._use_queue_policy()
            for action in self.scheduler.step(now):
                if isinstance(action, StartJob):
                    self._each(self.jobs.launch, action, now)
                elif isinstance(action, PreemptJob):
                    self._each(self.jobs.preempt, action, now)
            self.metrics.pending_reasons(self.scheduler.pending_codes())
            self.views.publish()
            self.policy_admin.flush_events(now)
            self.views.publish_counts()

    def _monitor(self, running: list[JobRecord], now: float) -> None:
        """GPU memory per job and outside gpuslice (then telemetry), the scheduler told of the outside
        use, and each job's graded response to its own use."""
        pids = {j.id: j.pid for j in running if j.pid is not None}
        usage, external = self.node.usage(pids)
        self.watch.observe(running, usage, external, now)
        for gpu in range(self.machine.gpu_count):
            self.scheduler.set_external_usage(gpu, external.get(gpu, 0))
        self.jobs.enforce(running, usage, now)

    def _each(self, step: Callable[[Any, float], None], item: Any, now: float) -> None:
        """One job's part of a pass; an error about it (its files, a full disk) is logged and the pass
        goes on with the next job. The next pass tries again: every step reads its state afresh."""
        try:
            step(item, now)
        except StoreUnavailable:  # not this job's fault: the whole pass ends and is retried
            raise
        except Exception:
            _log.exception("job %s: %s failed; the other jobs go on", getattr(item, "id", None) or
                           getattr(item, "job_id", "?"), step.__name__.lstrip("_"))  # fmt: skip


def _quotas(tenants: Mapping[str, TenantRecord]) -> dict[str, TenantQuota]:
    return {
        name: TenantQuota(
            name, weight=t.weight, max_gpus=t.max_gpus, max_gpu_memory_bytes=t.max_gpu_memory_bytes
        )
        for name, t in tenants.items()
    }
