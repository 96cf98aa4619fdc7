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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpuslice.errors import TraceFormatError
from gpuslice.hardware.node import NodeSpec
from gpuslice.sim.trace import DEFAULT_TRACE, bundled_dir, csv_rows, load_trace
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


def _time_rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    missing = (
        "no timestamps: a timed replay needs the columns "
        + ", ".join(TIME_COLUMNS)
        + " (the multigpu* traces have none); it lacks"
    )
    return list(csv_rows(path, TIME_COLUMNS, missing))


def load_timed_trace(name: str = DEFAULT_TRACE, trace_dir: Path | None = None) -> TimedTrace:
    """Trace ``name`` with its time columns, from ``trace_dir`` or the bundled copy (see the module
    docstring for what is left out and why). UnknownTrace / TraceFormatError name the problem."""
    static = load_trace(name, trace_dir)  # resources and nodes, parsed and checked as `sim openb` does
    directory = Path(trace_dir) if trace_dir is not None else bundled_dir()
    path = directory / f"openb_pod_list_{name}.csv"
    rows = _time_rows(path)
    parsed: list[tuple[int, str, Request, str, float, float | None, float | None]] = []
    end = 0.0
    for (line, row), pod in zip(rows, static.pods, strict=True):
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
        parsed.append((line, pod.name, pod.request, row.get("qos") or "", created, scheduled, deleted))
    jobs = [
        TimedJob(
            name=pod_name,
            request=request,
            qos=qos or "unknown",
            arrival=created,
            duration=deleted - scheduled,
            recorded_wait=scheduled - created,
            censored=deleted >= end,
        )
        for _, pod_name, request, qos, created, scheduled, deleted in parsed
        if scheduled is not None and deleted is not None
    ]
    if not jobs:
        raise TraceFormatError(f"{path}: no pod was ever scheduled, so none has a duration to replay")
    jobs.sort(key=lambda j: j.arrival)  # stable: equal arrivals keep file order
    return TimedTrace(
        name=name, nodes=static.nodes, jobs=tuple(jobs), end=end, never_scheduled=len(parsed) - len(jobs)
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
