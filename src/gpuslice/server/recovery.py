"""Recovery of the serve daemon after a restart (e.g. kill -9 of the server): a part of ``Daemon``.

```text
recover (once, before the first tick):
    RUNNING with a live supervisor (same pid + start time) or an exit file -> scheduler.adopt; the next
        tick reads the exit file as usual
    RUNNING that no longer fits the machine (fewer GPUs, MIG off)           -> stopped, CANCELLED at exit
    RUNNING whose supervisor never started (stored, then the server died) -> PENDING, no attempt counted
    RUNNING with neither                 -> FAILED "lost while the server was down", requeued per policy
    PENDING                              -> scheduler.submit again, in submission order
```
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuslice.errors import InternalError, InvalidRequest
from gpuslice.node.launcher import ExitStatus
from gpuslice.observe.reasons import FailureCode
from gpuslice.scheduler.node_scheduler import MigAssignment, NodeScheduler
from gpuslice.server.store import JobRecord, Store
from gpuslice.workload.job import JobState

__all__ = ["Recovery", "RecoveryReport"]


@dataclass
class RecoveryReport:
    """What ``recover`` found, by job id: re-adopted, read from their exit file later, lost, requeued."""

    adopted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


class Recovery:
    """The recovery side of ``Daemon``, which mixes this class in."""

    # What this part reads and calls of the daemon (set and defined in ``Daemon``).
    store: Store
    node: Any
    state_dir: Path
    grace_seconds: float
    scheduler: NodeScheduler
    clock: Callable[[], float]
    _lock: threading.RLock
    _new_scheduler: Callable[[], NodeScheduler]
    _exit_record: Callable[[JobRecord], ExitStatus | None]
    _kill_lost: Callable[[JobRecord], None]
    _stop_job: Callable[[JobRecord, str, float, str, float], None]
    _end: Callable[..., bool]
    _unstart: Callable[[JobRecord, str, float], None]

    def recover(self) -> RecoveryReport:
        """Rebuild the scheduler's picture from the store and the job directories (see module doc)."""
        report = RecoveryReport()
        with self._lock:
            now = self.clock()
            self.scheduler = self._new_scheduler()
            for job in self.store.jobs([JobState.RUNNING]):
                job = self._find_process(job)
                alive = job.pid is not None and self.node.is_alive(job.pid, job.proc_start_time or 0.0)
                if not alive and job.pid is None and not self.node.was_started(job.id, self.state_dir):
                    self._unstart(job, "requeued: the server stopped before its process started", now)
                    report.requeued.append(job.id)
                    continue
                if alive or self._has_record(job):
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
                lost = "lost while the server was down"
                if self._end(job, JobState.FAILED, lost, now, None, requeue=True, failure=FailureCode.LOST):
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

    def _has_record(self, job: JobRecord) -> bool:
        """An exit record of this attempt, or one that cannot be read (the first tick ends the job
        with why): either way the job is adopted, not lost here."""
        try:
            return self._exit_record(job) is not None
        except InternalError:
            return True

    def _find_process(self, job: JobRecord) -> JobRecord:
        """A RUNNING job stored without a pid (the server died mid-launch): look for its supervisor."""
        if job.pid is not None:
            return job
        found = self.node.find_supervisor(job.id, self.state_dir)
        if found is None:
            return job
        return self.store.update(job.id, pid=found.pid, pgid=found.pgid, proc_start_time=found.start_time)


def _mig(data: dict[str, Any] | None) -> MigAssignment | None:
    return None if data is None else MigAssignment(int(data["gpu"]), str(data["profile"]), int(data["start"]))
