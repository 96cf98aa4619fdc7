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

``Daemon`` is this loop plus four parts, one module each, mixed into the one class so that they share
its lock, store and scheduler: ``server/recovery.py`` (once, before the first tick, e.g. after kill -9
of the server), ``server/gpu_health.py`` (telemetry, GPU health, anomalies), ``server/policy_admin.py``
(policy files and their maps) and ``server/views.py`` (what the API and the metrics read).

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
import errno
import getpass
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuslice.errors import InternalError, InvalidRequest
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import mig_gpu
from gpuslice.node.enforcement import DEFAULT_SHARING
from gpuslice.node.launcher import ExitStatus
from gpuslice.node.mig_manager import MigCommandFailed
from gpuslice.node.telemetry import GpuReading, Telemetry
from gpuslice.observe.metrics import ServeMetrics
from gpuslice.observe.reasons import FailureCode
from gpuslice.policies import DEFAULT_PLACEMENT, placement_policy
from gpuslice.policies.queue import DEFAULT_QUEUE_POLICY
from gpuslice.programs.guard import GuardConfig, GuardedFactory
from gpuslice.programs.loader import resolve
from gpuslice.scheduler.node_scheduler import (
    NodeScheduler,
    PreemptJob,
    StartJob,
    TenantQuota,
)
from gpuslice.server.codec import spec_to_json
from gpuslice.server.errors import JobConflict, StoreUnavailable
from gpuslice.server.gpu_health import GpuWatch, anomaly_detector, anomaly_text, restored_health
from gpuslice.server.node_ops import NodeOps
from gpuslice.server.policy_admin import PolicyAdmin, queue_slot
from gpuslice.server.recovery import Recovery, RecoveryReport
from gpuslice.server.store import JobRecord, Store, TenantRecord
from gpuslice.server.views import DaemonViews, GpuSnapshot
from gpuslice.workload.job import DEFAULT_GRACE_SECONDS, JobSpec, JobState, RestartPolicy
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
# The supervisor sends the SIGKILL after the grace; if the group still lives this much later (the
# supervisor itself died), the daemon kills it.
_KILL_SLACK_SECONDS = 5.0
# A launch that fails with one of these lacked a resource for a moment (a file descriptor, memory, disk
# space): the job did not start, it waits for its next turn instead of failing.
_TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT, errno.EAGAIN,
                               errno.ENOMEM})  # fmt: skip


class Daemon(Recovery, GpuWatch, PolicyAdmin, DaemonViews):
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
        # The queue policy the scheduler calls is the slot's current one: a built-in, or a policy file
        # (verified, guarded) swapped in while serving; guard events wait for the lock holder.
        self._policy_events: deque[tuple[str, str]] = deque()
        self.policy_slots = {
            "queue": queue_slot(
                queue_policy,
                guard or GuardConfig(),
                lambda message: self._policy_events.append(("queue", message)),
            )
        }
        # The placement policy (a name, or a file verified and guarded here) advises which GPUs a job
        # gets, through the same placer as sim and the Kubernetes extender.
        self.placement = placement
        self._placement_factory = resolve(
            placement,
            "placement",
            placement_policy,
            guard or GuardConfig(),
            on_event=lambda message: self._policy_events.append(("placement", message)),
        )
        self.target = target
        self.health = restored_health(store, machine)
        self.scheduler = self._new_scheduler()
        self._usage: dict[str, dict[int, int]] = {}  # job -> GPU -> bytes, from the last monitor pass
        self._external: dict[int, int] = {}
        self.telemetry = telemetry  # None: no GPU readings (tests with a fake node)
        self._readings: dict[int, GpuReading] = {}  # GPU -> the last telemetry reading
        self._gpu_jobs: list[frozenset[str]] = [frozenset()] * machine.gpu_count
        self.anomalies = anomaly_detector(machine)
        self._published: GpuSnapshot | None = None  # GPU state at the end of the last tick (metrics)
        self._waiting: dict[str, str] = {}  # why each pending job waits, as of the last tick (job lists)
        self.metrics = ServeMetrics(self.snapshot)
        self.publish_counts()

    def _new_scheduler(self) -> NodeScheduler:
        scheduler = NodeScheduler(
            self.machine,
            tenants=_quotas(self.store.tenants()),
            grace_seconds=self.grace_seconds,
            placement=self._placement_factory,
            target=self.target,
        )
        scheduler.policy = self.policy_slots["queue"].current
        for g, health in self.health.unhealthy().items():
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
            self._stop_job(job, "cancel", self.grace_seconds, "cancel requested by user", now)
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
                self._record_never_runs(marked, now)
            self._waiting = dict(self.scheduler.queue())  # the marks show at once
            self._wake.set()

    def queue(self) -> list[tuple[JobRecord, str]]:
        with self._lock:
            order = self.scheduler.queue()
        jobs = {j.id: j for j in self.store.jobs([JobState.PENDING])}
        return [(jobs[i], reason) for i, reason in order if i in jobs]

    def log_path(self, job_id: str, stream: str) -> Path:
        return self.state_dir / "jobs" / job_id / f"{stream}.log"

    # -- the loop -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Recover, then run the loop in a background thread until ``stop``."""
        self.recover()
        self.publish_counts()
        self._thread = threading.Thread(target=self._run, name="gpuslice-daemon", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop (jobs keep running under their supervisors; a restart re-adopts them)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for slot in self.policy_slots.values():
            slot.close()  # a policy file's worker process (it would also die with this process)
        if isinstance(self._placement_factory, GuardedFactory):
            self._placement_factory.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except StoreUnavailable:  # locked or failing: the store logs it once a minute; next pass retries
                with contextlib.suppress(StoreUnavailable):  # what the pass did commit, for /v1/health
                    self.publish_counts()
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
                self._each(self._check_exit, job, now)
            running = self.store.jobs([JobState.RUNNING])
            for job in running:
                self._each(self._check_limits, job, now)
            if now - self._monitored_at >= self.monitor_seconds:
                self._monitored_at = now
                self._monitor(running, now)
            # The guard detaches a faulty policy inside a pass; the slot then holds the default again.
            self.scheduler.policy = self.policy_slots["queue"].current
            for action in self.scheduler.step(now):
                if isinstance(action, StartJob):
                    self._each(self._launch, action, now)
                elif isinstance(action, PreemptJob):
                    self._each(self._preempt, action, now)
            self.metrics.pending_reasons(self.scheduler.pending_codes())
            self._published = self._gpu_state()
            self._waiting = dict(self.scheduler.queue())
            self._flush_policy_events(now)
            self.publish_counts()

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
        try:
            job = self.store.transition(
                job.id, JobState.RUNNING, f"started on {where}", now,
                {"gpus": list(action.gpus), "attempt": job.attempts + 1},
                gpus=action.gpus, mig=mig, started_at=now, finished_at=None, pid=None, pgid=None,
                proc_start_time=None, exit_code=None, exit_signal=None, attempts=job.attempts + 1, stop="",
                stop_deadline=None, suspended=False,
            )  # fmt: skip
        except Exception:  # not stored (a full disk): the scheduler must not hold its GPUs either
            self.scheduler.finished(job.id)
            with contextlib.suppress(InvalidRequest):
                self.scheduler.submit(job.id, job.spec, job.submitted_at, admitted=True)
            raise
        try:
            env = self.node.job_env(job.spec, action.gpus, action.mig)
            about = {"spec": spec_to_json(job.spec), "submitted_at": job.submitted_at, "started_at": now,
                     "gpus": list(action.gpus), "mig": mig}  # fmt: skip
            launched = self.node.launch(job.id, job.spec, env, self.state_dir, attempt=job.attempts,
                                        about=about)  # fmt: skip
        except Exception as err:  # the job cannot start (bad cwd, no MPS, …): it fails, the loop goes on
            if isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNOS:  # short of a resource: later
                _log.warning("job %s could not start yet (%s); it waits for its next turn", job.id, err)
                self._unstart(job, f"could not start yet ({err.strerror or err}); waiting", now)
                return
            _log.error("launch of job %s failed: %s", job.id, err, exc_info=err)
            if isinstance(err, MigCommandFailed):  # the command and what it printed, for the operator
                self.store.event(job.id, "mig", str(err), now, err.details)
            self._end(job, JobState.FAILED, f"could not launch: {err}", now, None, requeue=False,
                      failure=FailureCode.LAUNCH)  # fmt: skip
            return
        self.store.update(job.id, pid=launched.pid, pgid=launched.pgid, proc_start_time=launched.start_time)
        if launched.containment:  # `gpuslice show` says what keeps this attempt's processes together
            self.store.event(job.id, "containment", launched.containment, now)

    def _unstart(self, job: JobRecord, reason: str, now: float) -> None:
        """A RUNNING job whose process never started goes back to the queue as it was: no attempt
        counted, no GPUs held (its restart policy is not asked: it did not run)."""
        with self.store.transaction():
            self.store.transition(job.id, JobState.PENDING, reason, now, gpus=(), mig=None, pid=None,
                                  pgid=None, proc_start_time=None, started_at=None, stop="",
                                  stop_deadline=None, suspended=False,
                                  attempts=max(0, job.attempts - 1))  # fmt: skip
        self.scheduler.finished(job.id)
        self.node.forget(job.id)
        with contextlib.suppress(InvalidRequest):  # it was placed here a moment ago; it can wait here
            self.scheduler.submit(job.id, job.spec, job.submitted_at, admitted=True)

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
        """The exit record of the job's current attempt. A record of another attempt (the server died
        after storing RUNNING, before the launch removed it) is none; InternalError for one that cannot
        be read. A record without an attempt number (an older supervisor's) is told by its start."""
        status = self.node.poll(job.id, self.state_dir)
        if status is not None and status.attempt is not None:
            if status.attempt == job.attempts:
                return status
            _log.warning("job %s: ignoring the exit record of attempt %s", job.id, status.attempt)
            return None
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
        """Whether a running job ended. Only a supervisor that is gone makes an end: while it lives the
        job runs, whatever files are in its folders (the supervisor writes the record, then exits)."""
        if job.pid is None:
            job = self._find_process(job)
        if job.pid is not None and self.node.is_alive(job.pid, job.proc_start_time or 0.0):
            if job.stop and job.stop_deadline is not None and now > job.stop_deadline + _KILL_SLACK_SECONDS:
                self.node.kill(job.pgid or job.pid)
            return
        try:
            status = self._exit_record(job)
        except InternalError as err:  # damage from outside; the job is over, the pass goes on
            self._kill_lost(job)
            self._end(job, JobState.FAILED, f"lost: {err}", now, None, requeue=True, failure=FailureCode.LOST)
            return
        if status is not None:
            self._finished(job, status, now)
        elif job.pid is None and not self.node.was_started(job.id, self.state_dir):
            # stored RUNNING, then the server stopped before the launch: it never ran
            self._unstart(job, "requeued: the server stopped before its process started", now)
        else:
            self._kill_lost(job)
            self._end(job, JobState.FAILED, "lost: its supervisor died without an exit record", now, None,
                      requeue=True, failure=FailureCode.LOST)  # fmt: skip

    def _finished(self, job: JobRecord, status: ExitStatus, now: float) -> None:
        code, fields = status.text(), {"exit_code": status.exit_code, "exit_signal": status.signal}
        if status.leftovers:  # the job ended with its last process, not its first
            self.store.event(job.id, "containment", status.leftover_text(), now, {"left": status.leftovers})
        if job.stop and status.succeeded and not status.stop_forwarded:  # it ended on its own, stop or not
            self._end(job, JobState.SUCCEEDED, f"exited 0 before the {job.stop} reached it", now, fields,
                      requeue=True)  # fmt: skip
        elif job.stop == "cancel":
            self._end(job, JobState.CANCELLED, f"cancelled by user ({code})", now, fields, requeue=False)
        elif job.stop == "preempt":
            self._end(job, JobState.PREEMPTED, f"preempted ({code})", now, fields, requeue=True)
        elif job.stop == "limit":
            limit = job.spec.max_runtime_seconds or 0.0
            why = f"stopped at its max runtime of {limit:g} s ({code})"
            self._end(job, JobState.FAILED, why, now, fields, requeue=False, failure=FailureCode.MAX_RUNTIME)
        elif job.stop == "enforce":
            why = f"killed for exceeding its GPU memory slice ({code})"
            self._end(
                job, JobState.FAILED, why, now, fields, requeue=False, failure=FailureCode.MEMORY_ENFORCEMENT
            )
        elif status.succeeded:
            self._end(job, JobState.SUCCEEDED, "exited 0", now, fields, requeue=True)
        else:
            self._end(job, JobState.FAILED, f"failed with {code}", now, fields, requeue=True,
                      failure=FailureCode.EXIT_CODE)  # fmt: skip

    def _end(
        self,
        job: JobRecord,
        state: JobState,
        reason: str,
        now: float,
        fields: dict[str, Any] | None,
        *,
        requeue: bool,
        failure: FailureCode | None = None,
    ) -> bool:
        """Move a running job to ``state``, release its GPUs, and requeue it if its policy says so;
        ``failure`` (required for FAILED) is the code the metrics count.

        One transaction: the end state, and the PENDING that follows it when requeued. Returns whether
        the job was requeued."""
        again = _requeue_reason(job, state) if requeue else None
        if state is JobState.FAILED:
            assert failure is not None, "a FAILED job needs its failure code"
            self.metrics.job_failed(failure)
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
                self.scheduler.submit(job.id, job.spec, job.submitted_at, admitted=True)
        self._wake.set()
        return again is not None

    # -- limits and enforcement -----------------------------------------------------------------------

    def _check_limits(self, job: JobRecord, now: float) -> None:
        limit = job.spec.max_runtime_seconds
        if limit is None or job.stop or job.started_at is None:
            return
        # how long its process has run, on the boot clock (a wall-clock step changes nothing); the
        # stored start before the process is known
        ran = self.node.running_seconds(job.proc_start_time) if job.proc_start_time is not None else None
        if (now - job.started_at if ran is None else ran) < limit:
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


def _quotas(tenants: Mapping[str, TenantRecord]) -> dict[str, TenantQuota]:
    return {
        name: TenantQuota(
            name, weight=t.weight, max_gpus=t.max_gpus, max_gpu_memory_bytes=t.max_gpu_memory_bytes
        )
        for name, t in tenants.items()
    }


def _queued_since(job: JobRecord) -> float:
    """When a job last entered the queue: its submit, or the end of its previous attempt (requeued)."""
    if job.attempts and job.finished_at is not None:
        return job.finished_at
    return job.submitted_at
