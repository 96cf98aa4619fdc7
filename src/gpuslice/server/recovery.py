"""Recovery of the serve daemon after a restart (e.g. kill -9 of the server).

```text
recover (once, before the first tick):
    RUNNING with a live supervisor (same pid + start time) or an exit file -> scheduler.adopt; the next
        tick reads the exit file as usual
    RUNNING that no longer fits the machine (fewer GPUs, MIG off)           -> stopped, CANCELLED at exit
    RUNNING whose supervisor never started (stored, then the server died) -> PENDING, no attempt counted
    RUNNING with neither                 -> FAILED "lost while the server was down", requeued per policy
    PENDING                              -> scheduler.submit again, in submission order; one its
        tenant's quota (lowered meanwhile) can never admit stays PENDING, marked, with a "quota" event
        that says so; only one the machine can no longer run is CANCELLED, its transition saying why
```

Before that, the store is checked against the launch records (records/<id>/job.json, written at each
launch): a store deleted, emptied, or missing its WAL after a kill -9 knows fewer jobs, or older
states, than the records. Then one warning line says so, every job whose supervisor still runs is put
back as RUNNING from its record (and adopted as above), jobs that ended meanwhile are not restored
(their folders and logs stay), and new jobs are numbered above every id ever used, so no folder is
reused. A state file that is not a database at all is refused at start (``Store``: one line, with the
move-aside that recovers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuslice.errors import InternalError, InvalidRequest, UserError
from gpuslice.observe.reasons import FailureCode
from gpuslice.scheduler.node_scheduler import MigAssignment, NodeScheduler
from gpuslice.server.codec import spec_from_json
from gpuslice.server.lifecycle import JobLifecycle
from gpuslice.server.store import JobRecord, Store
from gpuslice.workload.job import JobState

__all__ = ["Recovery", "RecoveryReport"]

_log = logging.getLogger("gpuslice.server")


@dataclass
class RecoveryReport:
    """What ``recover`` found, by job id: re-adopted, read from their exit file later, lost, requeued."""

    adopted: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # put back from launch records (a lost store)
    lost: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    over_quota: list[str] = field(default_factory=list)  # kept waiting: their quota can never admit them


class Recovery:
    """Rebuilds the serve daemon's picture after a restart, through its job lifecycle (``jobs``).

    ``scheduler`` gives the daemon's scheduler, made new for the run (``Daemon.recover``).
    """

    def __init__(
        self,
        store: Store,
        node: Any,
        jobs: JobLifecycle,
        *,
        scheduler: Callable[[], NodeScheduler],
        state_dir: Path,
    ) -> None:
        self._store = store
        self._node = node
        self._jobs = jobs
        self._scheduler = scheduler
        self._state_dir = state_dir

    def run(self, now: float) -> RecoveryReport:
        """Rebuild the (new, empty) scheduler's picture from the store and the job directories (see the
        module doc). Call with the daemon's lock held."""
        report = RecoveryReport()
        scheduler = self._scheduler()
        report.restored = self._restore_lost(now)
        for job in self._store.jobs([JobState.RUNNING]):
            job = self._jobs.find_process(job)
            alive = job.pid is not None and self._node.is_alive(job.pid, job.proc_start_time or 0.0)
            if not alive and job.pid is None and not self._node.was_started(job.id, self._state_dir):
                self._jobs.unstart(job, "requeued: the server stopped before its process started", now)
                report.requeued.append(job.id)
                continue
            if alive or self._has_record(job):
                try:
                    scheduler.adopt(job.id, job.spec, job.gpus, job.started_at or now, _mig(job.mig))
                except InvalidRequest as err:  # the machine changed under it (fewer GPUs, MIG off)
                    self._jobs.stop(
                        job, "cancel", self._jobs.grace_seconds, f"cannot be re-adopted: {err}", now
                    )
                    report.refused.append(job.id)
                    continue
                self._store.event(job.id, "recovery", "re-adopted after a server restart", now)
                report.adopted.append(job.id)
                continue
            report.lost.append(job.id)
            self._jobs.kill_lost(job)
            lost = "lost while the server was down"
            if self._jobs.end(job, JobState.FAILED, lost, now, None, requeue=True, failure=FailureCode.LOST):
                report.requeued.append(job.id)
        for job in self._store.jobs([JobState.PENDING]):
            if job.id in report.requeued:  # end() queued it already
                continue
            try:  # accepted before: a quota lowered since keeps it waiting, marked, never cancelled
                scheduler.submit(job.id, job.spec, job.submitted_at, admitted=True)
            except InvalidRequest as err:  # the machine changed under it: the transition says why
                self._store.transition(job.id, JobState.CANCELLED, f"can no longer run here: {err}", now)
                report.refused.append(job.id)
        report.over_quota = sorted(scheduler.never_runs(), key=_number)
        self.record_never_runs(report.over_quota, now, "; kept waiting after a server restart")
        return report

    def record_never_runs(self, job_ids: list[str], now: float, after: str = "") -> None:
        """An event for each pending job its tenant's quota can never admit (``quota`` kind)."""
        reasons = self._scheduler().never_runs()
        for job_id in job_ids:
            self._store.event(job_id, "quota", reasons[job_id].text + after, now)

    def _restore_lost(self, now: float) -> list[str]:
        """Jobs the launch records know better than the store (see the module doc); their ids."""
        records = self._node.launch_records(self._state_dir)
        folders = [p.name for p in (self._state_dir / "jobs").glob("*") if p.name.isdigit()]
        highest = max((int(i) for i in [*records, *folders] if i.isdigit()), default=0)
        known = {j.id: j for j in self._store.jobs()}
        restored = []
        for job_id, about in sorted(records.items(), key=lambda item: _number(item[0])):
            job = known.get(job_id)
            attempt = int(about["attempt"])
            if job is not None and (job.state is JobState.RUNNING or job.attempts >= attempt):
                continue  # the store knows this launch
            found = self._node.find_supervisor(job_id, self._state_dir)
            if found is None or not self._node.is_alive(found.pid, found.start_time):
                continue  # it ended while the store did not know: nothing holds a GPU
            try:
                spec = spec_from_json(about["spec"])
                self._store.restore_job(
                    job_id, spec, float(about["submitted_at"]), "restored from its launch record", now,
                    state=JobState.RUNNING.value, gpus=tuple(about["gpus"]), mig=about.get("mig"),
                    started_at=float(about["started_at"]), attempts=attempt, pid=found.pid,
                    pgid=found.pgid, proc_start_time=found.start_time,
                )  # fmt: skip
            except (KeyError, TypeError, ValueError, UserError) as err:
                _log.warning("job %s: its launch record cannot be restored (%s); left running", job_id, err)
                continue
            restored.append(job_id)
        if highest > self._store.highest_id() or restored:
            _log.warning(
                "state file %s knows less than the job records (highest job id %d, the store's %d): it was "
                "deleted, emptied or lost its WAL; %d running job(s) restored from their launch records, "
                "ended ones are not (their folders remain); new jobs are numbered from %d",
                self._store.path,
                highest,
                self._store.highest_id(),
                len(restored),
                highest + 1,
            )
            self._store.skip_ids_to(highest)
        return restored

    def _has_record(self, job: JobRecord) -> bool:
        """An exit record of this attempt, or one that cannot be read (the first tick ends the job
        with why): either way the job is adopted, not lost here."""
        try:
            return self._jobs.exit_record(job) is not None
        except InternalError:
            return True


def _number(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (0, job_id)


def _mig(data: dict[str, Any] | None) -> MigAssignment | None:
    return None if data is None else MigAssignment(int(data["gpu"]), str(data["profile"]), int(data["start"]))
