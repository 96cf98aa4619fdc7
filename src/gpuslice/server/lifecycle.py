"""A serve job's life from start to end: launch, stop, exit, requeue, limits and enforcement.

```text
launch       StartJob -> store RUNNING (GPUs) *then* node.launch, then pid; a launch short of
             descriptors, memory or disk -> PENDING again (unstart), any other failure -> FAILED
preempt      PreemptJob -> stop: SIGTERM now, SIGKILL after the grace; PREEMPTED -> PENDING at exit
check_exit   supervisor alive -> still running; gone -> its exit record -> end (state, requeue per policy);
             no record -> FAILED "lost" (what is left of it killed first); never started -> unstart
check_limits max_runtime passed -> stop "limit": FAILED "exceeded max runtime" at exit
enforce      a job over its memory slice -> the node's graded response: warn, suspend, resume, kill
```

The store is written before any irreversible act, and the scheduler follows it: a job ends in the store
(one transaction: its end state and the PENDING that follows when it is requeued) before its GPUs are
released in the scheduler. Every method runs with the daemon's lock held (its caller takes it).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuslice.errors import InternalError, InvalidRequest
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import mig_gpu
from gpuslice.node.launcher import ExitStatus
from gpuslice.node.mig_manager import MigCommandFailed
from gpuslice.observe.metrics import ServeMetrics
from gpuslice.observe.reasons import FailureCode
from gpuslice.scheduler.node_scheduler import NodeScheduler, PreemptJob, StartJob
from gpuslice.server.codec import spec_to_json
from gpuslice.server.gpu_health import GpuWatch
from gpuslice.server.store import JobRecord, Store
from gpuslice.server.views import memory_limit
from gpuslice.workload.job import JobState, RestartPolicy

__all__ = ["JobLifecycle"]

_log = logging.getLogger("gpuslice.server")

# The supervisor sends the SIGKILL after the grace; if the group still lives this much later (the
# supervisor itself died), the daemon kills it.
_KILL_SLACK_SECONDS = 5.0
# A launch that fails with one of these lacked a resource for a moment (a file descriptor, memory, disk
# space): the job did not start, it waits for its next turn instead of failing.
_TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT, errno.EAGAIN,
                               errno.ENOMEM})  # fmt: skip


class JobLifecycle:
    """Starts, stops and ends the serve daemon's jobs (store first, then the scheduler and the node).

    ``scheduler`` gives the daemon's scheduler of the moment (recovery replaces it); ``watch`` forgets an
    ended job's readings; ``wake`` is set when an end frees GPUs, so the next pass comes at once.
    """

    def __init__(
        self,
        store: Store,
        machine: Machine,
        node: Any,
        metrics: ServeMetrics,
        watch: GpuWatch,
        *,
        scheduler: Callable[[], NodeScheduler],
        state_dir: Path,
        grace_seconds: float,
        wake: threading.Event,
    ) -> None:
        self._store = store
        self._machine = machine
        self._node = node
        self._metrics = metrics
        self._watch = watch
        self._scheduler = scheduler
        self._state_dir = state_dir
        self.grace_seconds = grace_seconds
        self._wake = wake

    def launch(self, action: StartJob, now: float) -> None:
        job = self._store.get(action.job_id)
        self._metrics.started(job.spec.priority.name.lower(), now - _queued_since(job))
        gpus_text = ",".join(map(str, action.gpus))
        where = f"MIG {action.mig.profile} on GPU {action.mig.gpu}" if action.mig else f"GPU {gpus_text}"
        mig = None
        if action.mig is not None:
            profile = mig_gpu(self._machine.gpus[action.mig.gpu].mig_model).profile(action.mig.profile)
            mig = {"gpu": action.mig.gpu, "profile": profile.name, "start": action.mig.start,
                   "memory_bytes": profile.memory_bytes}  # fmt: skip
        try:
            job = self._store.transition(
                job.id, JobState.RUNNING, f"started on {where}", now,
                {"gpus": list(action.gpus), "attempt": job.attempts + 1},
                gpus=action.gpus, mig=mig, started_at=now, finished_at=None, pid=None, pgid=None,
                proc_start_time=None, exit_code=None, exit_signal=None, attempts=job.attempts + 1, stop="",
                stop_deadline=None, suspended=False,
            )  # fmt: skip
        except Exception:  # not stored (a full disk): the scheduler must not hold its GPUs either
            self._scheduler().finished(job.id)
            with contextlib.suppress(InvalidRequest):
                self._scheduler().submit(job.id, job.spec, job.submitted_at, admitted=True)
            raise
        try:
            env = self._node.job_env(job.spec, action.gpus, action.mig)
            about = {"spec": spec_to_json(job.spec), "submitted_at": job.submitted_at, "started_at": now,
                     "gpus": list(action.gpus), "mig": mig}  # fmt: skip
            launched = self._node.launch(job.id, job.spec, env, self._state_dir, attempt=job.attempts,
                                        about=about)  # fmt: skip
        except Exception as err:  # the job cannot start (bad cwd, no MPS, …): it fails, the loop goes on
            if isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNOS:  # short of a resource: later
                _log.warning("job %s could not start yet (%s); it waits for its next turn", job.id, err)
                self.unstart(job, f"could not start yet ({err.strerror or err}); waiting", now)
                return
            _log.error("launch of job %s failed: %s", job.id, err, exc_info=err)
            if isinstance(err, MigCommandFailed):  # the command and what it printed, for the operator
                self._store.event(job.id, "mig", str(err), now, err.details)
            self.end(job, JobState.FAILED, f"could not launch: {err}", now, None, requeue=False,
                      failure=FailureCode.LAUNCH)  # fmt: skip
            return
        self._store.update(job.id, pid=launched.pid, pgid=launched.pgid, proc_start_time=launched.start_time)
        if launched.containment:  # `gpuslice show` says what keeps this attempt's processes together
            self._store.event(job.id, "containment", launched.containment, now)

    def unstart(self, job: JobRecord, reason: str, now: float) -> None:
        """A RUNNING job whose process never started goes back to the queue as it was: no attempt
        counted, no GPUs held (its restart policy is not asked: it did not run)."""
        with self._store.transaction():
            self._store.transition(job.id, JobState.PENDING, reason, now, gpus=(), mig=None, pid=None,
                                  pgid=None, proc_start_time=None, started_at=None, stop="",
                                  stop_deadline=None, suspended=False,
                                  attempts=max(0, job.attempts - 1))  # fmt: skip
        self._scheduler().finished(job.id)
        self._node.forget(job.id)
        with contextlib.suppress(InvalidRequest):  # it was placed here a moment ago; it can wait here
            self._scheduler().submit(job.id, job.spec, job.submitted_at, admitted=True)

    def preempt(self, action: PreemptJob, now: float) -> None:
        job = self._store.get(action.job_id)
        if job.state is not JobState.RUNNING or job.stop:
            return
        reason = f"preempted for job {action.for_job}: SIGTERM, SIGKILL after {action.grace_seconds:g} s"
        self._metrics.preempted(job.spec.tenant, job.spec.priority.name.lower())
        self.stop(job, "preempt", action.grace_seconds, reason, now)

    def stop(self, job: JobRecord, why: str, grace: float, reason: str, now: float) -> None:
        with self._store.transaction():
            self._store.update(job.id, stop=why, stop_deadline=now + grace)
            self._store.event(job.id, "signal", reason, now, {"stop": why, "grace_seconds": grace})
        if job.pgid is not None:
            self._node.terminate(job.pgid, grace)

    # -- exits ----------------------------------------------------------------------------------------

    def find_process(self, job: JobRecord) -> JobRecord:
        """A RUNNING job stored without a pid (the server died mid-launch): look for its supervisor."""
        if job.pid is not None:
            return job
        found = self._node.find_supervisor(job.id, self._state_dir)
        if found is None:
            return job
        return self._store.update(job.id, pid=found.pid, pgid=found.pgid, proc_start_time=found.start_time)

    def exit_record(self, job: JobRecord) -> ExitStatus | None:
        """The exit record of the job's current attempt. A record of another attempt (the server died
        after storing RUNNING, before the launch removed it) is none; InternalError for one that cannot
        be read. A record without an attempt number (an older supervisor's) is told by its start."""
        status = self._node.poll(job.id, self._state_dir)
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

    def kill_lost(self, job: JobRecord) -> None:
        """SIGKILL what is left of a job whose supervisor is gone, before it is recorded as ended: its
        processes must never outlive the record that says they ended (nor run beside a restart)."""
        if job.pgid is not None:
            self._node.kill(job.pgid)

    def check_exit(self, job: JobRecord, now: float) -> None:
        """Whether a running job ended. Only a supervisor that is gone makes an end: while it lives the
        job runs, whatever files are in its folders (the supervisor writes the record, then exits)."""
        if job.pid is None:
            job = self.find_process(job)
        if job.pid is not None and self._node.is_alive(job.pid, job.proc_start_time or 0.0):
            if job.stop and job.stop_deadline is not None and now > job.stop_deadline + _KILL_SLACK_SECONDS:
                self._node.kill(job.pgid or job.pid)
            return
        try:
            status = self.exit_record(job)
        except InternalError as err:  # damage from outside; the job is over, the pass goes on
            self.kill_lost(job)
            self.end(job, JobState.FAILED, f"lost: {err}", now, None, requeue=True, failure=FailureCode.LOST)
            return
        if status is not None:
            self._finished(job, status, now)
        elif job.pid is None and not self._node.was_started(job.id, self._state_dir):
            # stored RUNNING, then the server stopped before the launch: it never ran
            self.unstart(job, "requeued: the server stopped before its process started", now)
        else:
            self.kill_lost(job)
            self.end(job, JobState.FAILED, "lost: its supervisor died without an exit record", now, None,
                      requeue=True, failure=FailureCode.LOST)  # fmt: skip

    def _finished(self, job: JobRecord, status: ExitStatus, now: float) -> None:
        code, fields = status.text(), {"exit_code": status.exit_code, "exit_signal": status.signal}
        if status.leftovers:  # the job ended with its last process, not its first
            self._store.event(job.id, "containment", status.leftover_text(), now, {"left": status.leftovers})
        if job.stop and status.succeeded and not status.stop_forwarded:  # it ended on its own, stop or not
            self.end(job, JobState.SUCCEEDED, f"exited 0 before the {job.stop} reached it", now, fields,
                      requeue=True)  # fmt: skip
        elif job.stop == "cancel":
            self.end(job, JobState.CANCELLED, f"cancelled by user ({code})", now, fields, requeue=False)
        elif job.stop == "preempt":
            self.end(job, JobState.PREEMPTED, f"preempted ({code})", now, fields, requeue=True)
        elif job.stop == "limit":
            limit = job.spec.max_runtime_seconds or 0.0
            why = f"stopped at its max runtime of {limit:g} s ({code})"
            self.end(job, JobState.FAILED, why, now, fields, requeue=False, failure=FailureCode.MAX_RUNTIME)
        elif job.stop == "enforce":
            why = f"killed for exceeding its GPU memory slice ({code})"
            self.end(
                job, JobState.FAILED, why, now, fields, requeue=False, failure=FailureCode.MEMORY_ENFORCEMENT
            )
        elif status.succeeded:
            self.end(job, JobState.SUCCEEDED, "exited 0", now, fields, requeue=True)
        else:
            self.end(job, JobState.FAILED, f"failed with {code}", now, fields, requeue=True,
                      failure=FailureCode.EXIT_CODE)  # fmt: skip

    def end(
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
            self._metrics.job_failed(failure)
        with self._store.transaction():
            self._store.transition(job.id, state, reason, now, finished_at=now, stop="", stop_deadline=None,
                                  suspended=False, **(fields or {}))  # fmt: skip
            if again is not None:
                self._store.transition(job.id, JobState.PENDING, again, now)
        self._scheduler().finished(job.id)
        self._node.forget(job.id)
        self._watch.forget(job.id)
        if again is not None:
            with contextlib.suppress(InvalidRequest):  # it ran here before; it can run again
                self._scheduler().submit(job.id, job.spec, job.submitted_at, admitted=True)
        self._wake.set()
        return again is not None

    # -- limits and enforcement -----------------------------------------------------------------------

    def check_limits(self, job: JobRecord, now: float) -> None:
        limit = job.spec.max_runtime_seconds
        if limit is None or job.stop or job.started_at is None:
            return
        # how long its process has run, on the boot clock (a wall-clock step changes nothing); the
        # stored start before the process is known
        ran = self._node.running_seconds(job.proc_start_time) if job.proc_start_time is not None else None
        if (now - job.started_at if ran is None else ran) < limit:
            return
        self.stop(job, "limit", self.grace_seconds, f"max runtime {limit:g} s reached: SIGTERM", now)

    def enforce(self, running: list[JobRecord], usage: dict[str, dict[int, int]], now: float) -> None:
        """The graded response (warn, suspend, resume, kill) for each job over its memory slice."""
        tenants = self._store.tenants()
        for job in running:
            limit = memory_limit(self._machine, job)
            used = max(usage.get(job.id, {}).values(), default=0)
            if limit <= 0 or job.pgid is None or job.stop in ("enforce", "cancel", "limit"):
                continue
            decision = self._node.respond(job.id, tenants.get(job.spec.tenant), used, limit, now)
            if decision is None:
                continue
            action, reason = decision
            self._metrics.enforced(action, job.spec.tenant)
            self._store.event(
                job.id, "enforcement", reason, now, {"action": action, "used": used, "limit": limit}
            )
            if action == "suspend" and not job.suspended:
                self._node.suspend(job.pgid)
                self._store.update(job.id, suspended=True)
            elif action == "resume" and job.suspended:
                self._node.resume(job.pgid)
                self._store.update(job.id, suspended=False)
            elif action == "kill":
                with self._store.transaction():
                    self._store.update(job.id, stop="enforce", stop_deadline=now)
                self._node.kill(job.pgid)


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


def _queued_since(job: JobRecord) -> float:
    """When a job last entered the queue: its submit, or the end of its previous attempt (requeued)."""
    if job.attempts and job.finished_at is not None:
        return job.finished_at
    return job.submitted_at
