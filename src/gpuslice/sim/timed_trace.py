"""Timed openb traces: when each pod arrived, how long it ran, and how long production made it wait.

From the pod CSV's time columns (seconds from the trace start):

- arrival = ``creation_time``; the replay compresses it by ``load`` (arrival / load), so a load of 2
  offers the same jobs in half the time;
- duration = ``deletion_time − scheduled_time``: what the pod held its resources for in production;
- recorded wait = ``scheduled_time − creation_time``: production's own queueing delay, shown beside the
  replay's as the reference.

Two kinds of pods cannot be replayed as they are:

- *never scheduled* in production (``scheduled_time`` empty; phase Pending): they have no duration. They
  are left out of the replay and counted (``TimedTrace.never_scheduled``);
- *censored*: still running when the trace ends (``deletion_time`` is the trace's last instant). Their
  duration is only a lower bound. They are replayed with it (so they hold GPUs as long as production
  saw), and left out of the JCT and wait statistics, which would otherwise take a cut-off as a finish.

A trace without the time columns (the ``multigpu*`` files have only the five resource columns), a
negative duration or wait, or a time that is not a finite number is a TraceFormatError.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpuslice.errors import TraceFormatError
from gpuslice.hardware.node import NodeSpec
from gpuslice.sim.trace import (
    DEFAULT_TRACE,
    POD_COLUMNS,
    PodReader,
    check_mig_profiles,
    csv_rows,
    load_nodes,
    trace_files,
)
from gpuslice.workload.request import Request

__all__ = [
    "TIME_COLUMNS",
    "RepeatedJobs",
    "TimedJob",
    "TimedTrace",
    "every_kth_node",
    "load_timed_trace",
    "repeat_trace",
]

TIME_COLUMNS = ("qos", "creation_time", "deletion_time", "scheduled_time")


@dataclass(frozen=True, slots=True)
class TimedJob:
    """One replayable pod. Times in seconds from the trace start, before any load compression."""

    name: str
    request: Request
    qos: str
    arrival: float
    duration: float
    recorded_wait: float
    censored: bool


@dataclass(frozen=True)
class TimedTrace:
    """A trace's replayable pods sorted by arrival, its node list, and what was left out."""

    name: str
    nodes: tuple[NodeSpec, ...]
    jobs: Sequence[TimedJob]  # a tuple, or a stream that makes each pod when read (``RepeatedJobs``)
    end: float  # the trace's last instant (latest time in it)
    never_scheduled: int  # pods production never started: no duration, not replayed

    @property
    def censored(self) -> int:
        return sum(j.censored for j in self.jobs)


def _time(path: Path, line: int, row: dict[str, str], column: str) -> float | None:
    """A time cell: None when empty, else a finite, non-negative number (TraceFormatError otherwise)."""
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(f"{path}, row {line}: {column} is {text!r}, expected seconds") from None
    if not math.isfinite(value) or value < 0:
        raise TraceFormatError(f"{path}, row {line}: {column} is {text!r}, expected finite seconds >= 0")
    return value


_NO_TIMES = (
    "no timestamps: a timed replay needs the columns "
    + ", ".join(TIME_COLUMNS)
    + " (the multigpu* traces have none); it lacks"
)


def load_timed_trace(
    name: str = DEFAULT_TRACE,
    trace_dir: Path | None = None,
    read: Callable[[int, int], None] | None = None,
) -> TimedTrace:
    """Trace ``name`` with its time columns, from ``trace_dir`` or the bundled copy (see the module
    docstring for what is left out and why). UnknownTrace / TraceFormatError name the problem. The pod
    CSV is read once, its resources parsed and checked as `sim openb` does; ``read(bytes_read,
    file_bytes)`` is told how far the read is every few thousand rows."""
    path, node_path = trace_files(name, trace_dir)
    nodes = load_nodes(node_path)
    size = path.stat().st_size
    pods = PodReader(path)
    rows = csv_rows(
        path,
        POD_COLUMNS,
        also=(TIME_COLUMNS, _NO_TIMES),
        read=None if read is None else lambda n: read(n, size),
    )
    jobs: list[TimedJob] = []
    deleted_at = array("d")  # jobs[i]'s deletion time: censored once the trace's end is known
    end, rows_read = 0.0, 0
    for line, row in rows:
        rows_read += 1
        pod = pods.pod(line, row)
        created = _time(path, line, row, "creation_time")
        if created is None:
            raise TraceFormatError(f"{path}, row {line}: creation_time is empty; every pod needs one")
        scheduled = _time(path, line, row, "scheduled_time")
        deleted = _time(path, line, row, "deletion_time")
        if scheduled is not None and scheduled < created:
            raise TraceFormatError(
                f"{path}, row {line}: scheduled_time {scheduled:g} is before creation_time {created:g} "
                "(a negative wait)"
            )
        if scheduled is not None and (deleted is None or deleted < scheduled):
            shown = "empty" if deleted is None else f"{deleted:g}"
            raise TraceFormatError(
                f"{path}, row {line}: deletion_time {shown} is before scheduled_time {scheduled:g} "
                "(a negative duration)"
            )
        end = max(end, created, scheduled or 0.0, deleted or 0.0)
        if scheduled is None or deleted is None:
            continue  # never started in production: no duration (module docstring)
        qos = sys.intern(row.get("qos") or "unknown")  # a few distinct values over a million pods
        jobs.append(
            TimedJob(pod.name, pod.request, qos, created, deleted - scheduled, scheduled - created, False)
        )
        deleted_at.append(deleted)
    if not rows_read:
        raise TraceFormatError(f"{path}: no pods")
    check_mig_profiles(nodes, pods.requests, path)
    if not jobs:
        raise TraceFormatError(f"{path}: no pod was ever scheduled, so none has a duration to replay")
    for i, deleted in enumerate(deleted_at):
        if deleted >= end:  # still running when the trace ends
            jobs[i] = replace(jobs[i], censored=True)
    jobs.sort(key=lambda j: j.arrival)  # stable: equal arrivals keep file order
    return TimedTrace(
        name=name, nodes=nodes, jobs=tuple(jobs), end=end, never_scheduled=rows_read - len(jobs)
    )


def every_kth_node(trace: TimedTrace, k: int) -> TimedTrace:
    """The trace on every ``k``-th node of its cluster (the first node kept): the same pods on a smaller
    cluster, where queues form at a moderate load. Named ``NAME-everyK`` when ``k`` > 1 (a file name too:
    the plots are named after the trace)."""
    if k < 1:
        raise ValueError("k must be at least 1")
    if k == 1:
        return trace
    return replace(trace, name=f"{trace.name}-every{k}", nodes=trace.nodes[::k])


def repeat_trace(trace: TimedTrace, times: int) -> TimedTrace:
    """The trace played ``times`` times back to back (copy k shifted by k × the trace's length, pod names
    suffixed ``#k``): more of the same workload, for offered loads a single copy cannot reach (the
    openb pod lists ask for about the cluster's capacity in total, so compressing one copy alone never
    overloads the cluster)."""
    if times < 1:
        raise ValueError("times must be at least 1")
    if times == 1:
        return trace
    period = trace.end + 1.0
    return TimedTrace(
        name=f"{trace.name}x{times}",
        nodes=trace.nodes,
        jobs=RepeatedJobs(tuple(trace.jobs), times, period),
        end=trace.end + (times - 1) * period,
        never_scheduled=trace.never_scheduled * times,
    )


class RepeatedJobs(Sequence[TimedJob]):
    """``times`` copies of ``jobs`` back to back, copy k shifted by k × ``period`` and its pod names
    suffixed ``#k``. Nothing is stored per copy: each pod is made when it is read, so a replay that
    iterates it holds only the pods in the system."""

    __slots__ = ("_jobs", "_period", "_times")

    def __init__(self, jobs: tuple[TimedJob, ...], times: int, period: float) -> None:
        self._jobs, self._times, self._period = jobs, times, period

    def __len__(self) -> int:
        return len(self._jobs) * self._times

    def _copy(self, k: int, job: TimedJob) -> TimedJob:
        return replace(job, name=f"{job.name}#{k}", arrival=job.arrival + k * self._period)

    def __iter__(self) -> Iterator[TimedJob]:
        for k in range(self._times):
            for job in self._jobs:
                yield self._copy(k, job)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        n = len(self)
        if isinstance(i, slice):
            return tuple(self[k] for k in range(*i.indices(n)))
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("pod index out of range")
        k, r = divmod(i, len(self._jobs))
        return self._copy(k, self._jobs[r])
