"""What each job really holds on the GPUs, and the graded response when it holds more than its slice.

```text
usage(machine, {job_id: supervisor pid}) ─► per job {gpu: bytes}, external {gpu: bytes}
    real machine:      NVML per-process memory (nvmlDeviceGetComputeRunningProcesses) → each PID is
                       matched to a job by the job's process tree (psutil children of the supervisor)
                       or its process group; PIDs of no job are "external" (someone else's memory)
    simulated machine: the report files of gpuslice-fake-load processes (node/fake_load.py), found
                       through each process's GPUSLICE_REPORT_FILE; fake loads outside any job are external
    --sharing shim:    a job with a shim region (shim_dir/<job>.region) is read from it instead: the bytes
                       its live processes hold through the shim, on the host GPUs the region names
GradedResponse(config).decide(job_id, used, limit, now) ─► warn → suspend → kill, once each per episode
```

The monitor reports and advises; the daemon applies the actions (``launcher.suspend``/``kill``) and
records each one as an event. NVML reports host PIDs, so a server inside a container without the host
PID namespace sees every GPU process as external (wookayin/gpustat#117; docs/references.md, "serve").
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.machine import Machine
from gpuslice.node import private_files
from gpuslice.node.discovery import gpu_processes, is_simulated
from gpuslice.node.fake_load import REPORT_ENV
from gpuslice.shim import read_region, region_path
from gpuslice.shim.region import RegionError
from gpuslice.units import format_size

__all__ = [
    "Action",
    "ActionKind",
    "GradedResponse",
    "ResponseConfig",
    "job_processes",
    "shim_usage",
    "usage",
]

Usage = dict[str, dict[int, int]]
External = dict[int, int]


def job_processes(pids: Mapping[str, int]) -> dict[int, str]:
    """{pid: job_id} for every process of each job: the supervisor, its descendants, and anything still
    in its process group (a daemonised child leaves the tree but keeps the group).

    One pass over the process table serves every job: asking psutil for each supervisor's children
    reads the whole table once per job, which with 64 running jobs was 90 % of an idle server's CPU."""
    parent: dict[int, int] = {}
    group: dict[int, int] = {}
    for p in psutil.process_iter(["ppid"]):
        parent[p.pid] = p.info["ppid"]
        with contextlib.suppress(OSError):
            group[p.pid] = os.getpgid(p.pid)
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    owner: dict[int, str] = {}
    by_group: dict[int, str] = {}
    for job_id, root in pids.items():
        if root not in parent:
            continue  # the supervisor is gone
        family = [root]
        while family:
            pid = family.pop()
            owner[pid] = job_id
            family.extend(c for c in children.get(pid, ()) if c not in owner)
        if root in group:
            by_group[group[root]] = job_id
    for pid, pgid in group.items():
        if pid not in owner and pgid in by_group:
            owner[pid] = by_group[pgid]
    return owner


def _gpu_index(machine: Machine) -> dict[str, int]:
    """Device names a report may use → GPU index: UUIDs, MIG UUIDs made from them, and plain indices."""
    index = {str(g.index): g.index for g in machine.gpus}
    index.update({g.uuid: g.index for g in machine.gpus})
    return index


def _resolve(device: str, index: dict[str, int]) -> int | None:
    if device in index:
        return index[device]
    for gpu_uuid, gpu in index.items():  # simulated MIG UUIDs embed their GPU's: MIG-sim-…-0003-3g.40gb-4
        if gpu_uuid.startswith("GPU-") and device.startswith("MIG-" + gpu_uuid.removeprefix("GPU-") + "-"):
            return gpu
    return None


_REPORT_MAX_BYTES = 1 << 20  # a fake load's report is a few hundred bytes


def _simulated_usage(
    machine: Machine, owner: dict[int, str], jobs: Mapping[str, int]
) -> tuple[Usage, External]:
    per_job: Usage = {job_id: {} for job_id in jobs}
    external: External = {}
    index = _gpu_index(machine)
    seen: set[Path] = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmdline = p.info.get("cmdline") or []
        if not any("fake-load" in part or "fake_load" in part for part in cmdline):
            continue
        try:
            report = p.environ().get(REPORT_ENV)
        except psutil.Error:
            continue
        if not report or Path(report) in seen:
            continue
        try:
            # Any process may name any path here: a FIFO or /dev/zero must not stall the daemon's loop.
            data = json.loads(private_files.read_regular(report, _REPORT_MAX_BYTES))
            if int(data["pid"]) != p.pid:
                continue  # written by another process: the reporter itself, or an earlier run
            memory = {str(k): int(v) for k, v in data["memory_bytes"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, private_files.UnsafeFile):
            continue
        seen.add(Path(report))
        target = per_job[owner[p.pid]] if p.pid in owner else external
        for device, used in memory.items():
            gpu = _resolve(device, index)
            if gpu is not None:
                target[gpu] = target.get(gpu, 0) + used
    return per_job, external


def shim_usage(directory: Path, job_ids: Iterable[str]) -> Usage:
    """{job: {gpu index: bytes}} for the jobs that have a shim region in ``directory``; others are left
    out (no process of theirs has called the driver yet, or they run without the shim)."""
    found: Usage = {}
    for job_id in job_ids:
        try:
            region = read_region(region_path(directory, job_id))
        except (OSError, RegionError):
            continue
        found[job_id] = {d.host_gpu: d.used_bytes for d in region.devices if d.host_gpu >= 0}
    return found


def usage(
    machine: Machine, jobs: Mapping[str, int], *, nvml: Any | None = None, shim_dir: Path | None = None
) -> tuple[Usage, External]:
    """(per job {gpu index: bytes}, external {gpu index: bytes}) right now.

    ``jobs`` maps job ids to their supervisor PIDs (``LaunchedJob.pid``). Every job in ``jobs`` is in
    the result, with {} when it holds nothing; GPUs with no external memory are left out of external.
    ``nvml`` is a pynvml-like module for tests (real machines only). With ``shim_dir`` (--sharing shim),
    a job's shim region replaces the per-process reading: what the shim counted is what it fences, and
    NVML's figure would add the CUDA context, which no slice limit covers."""
    per_job, external = _usage(machine, jobs, nvml)
    if shim_dir is not None:
        per_job.update(shim_usage(shim_dir, jobs))
    return per_job, external


def _usage(machine: Machine, jobs: Mapping[str, int], nvml: Any | None) -> tuple[Usage, External]:
    owner = job_processes(jobs)
    if is_simulated(machine):
        return _simulated_usage(machine, owner, jobs)
    per_job: Usage = {job_id: {} for job_id in jobs}
    external: External = {}
    for gpu, processes in gpu_processes(nvml).items():
        for pid, used in processes.items():
            target = per_job[owner[pid]] if pid in owner else external
            target[gpu] = target.get(gpu, 0) + used
    return per_job, external


class ActionKind(enum.StrEnum):
    WARN = "warn"
    SUSPEND = "suspend"  # launcher.suspend: SIGSTOP (memory stays held, but stops growing)
    KILL = "kill"  # launcher.kill: SIGKILL


@dataclass(frozen=True, slots=True)
class Action:
    """One enforcement step for the daemon to apply and record as an event."""

    kind: ActionKind
    job_id: str
    used_bytes: int
    limit_bytes: int
    over_seconds: float  # how long the job has been over its limit
    reason: str  # for the event: "uses 30 GiB of its 20 GiB slice (150 %) for 12 s: suspended"


@dataclass(frozen=True, slots=True)
class ResponseConfig:
    """A tenant's graded response. A job is *over* when used > limit × over_percent / 100.

    It is warned the first time it is over, suspended after ``suspend_after_seconds`` over, and killed
    after ``kill_after_seconds`` over (both counted from the first moment over; None = never). A job
    that drops back under before a step starts a new episode: the clock restarts and it may be warned
    again. A suspended job does not resume by itself: the daemon (or a person) decides."""

    over_percent: float = 100.0
    suspend_after_seconds: float | None = 30.0
    kill_after_seconds: float | None = 120.0

    def __post_init__(self) -> None:
        for name in ("over_percent", "suspend_after_seconds", "kill_after_seconds"):
            value = getattr(self, name)
            if value is None and name != "over_percent":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InvalidRequest(f"{name}: {value!r} must be a finite number" + (
                    "" if name == "over_percent" else " of seconds, or null for never"))  # fmt: skip
        if self.over_percent <= 0:
            raise InvalidRequest(f"over_percent: {self.over_percent} must be positive")
        for name in ("suspend_after_seconds", "kill_after_seconds"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvalidRequest(f"{name}: {value} cannot be negative")


@dataclass(slots=True)
class _Episode:
    since: float
    done: set[ActionKind]


class GradedResponse:
    """Turns a job's memory readings over time into warn → suspend → kill, each returned once.

    One instance per tenant config; it keeps, per job, when the current over-limit episode began.
    ``decide`` returns at most one action per call, the most severe that is due and not yet given
    (so a long gap between readings goes straight to kill rather than replaying warn and suspend)."""

    _ORDER = (ActionKind.KILL, ActionKind.SUSPEND, ActionKind.WARN)

    def __init__(self, config: ResponseConfig | None = None) -> None:
        self.config = config or ResponseConfig()
        self._episodes: dict[str, _Episode] = {}

    def _due(self, kind: ActionKind, over_seconds: float) -> bool:
        c = self.config
        threshold = {
            ActionKind.WARN: 0.0,
            ActionKind.SUSPEND: c.suspend_after_seconds,
            ActionKind.KILL: c.kill_after_seconds,
        }[kind]
        return threshold is not None and over_seconds >= threshold

    def decide(self, job_id: str, used: int, limit: int, now: float) -> Action | None:
        """The action due for ``job_id`` using ``used`` bytes of a ``limit``-byte slice at time ``now``.

        ``limit`` 0 means the job has no memory slice (whole GPUs): nothing is ever due."""
        if limit <= 0 or used * 100 <= limit * self.config.over_percent:
            self._episodes.pop(job_id, None)
            return None
        episode = self._episodes.setdefault(job_id, _Episode(since=now, done=set()))
        over_seconds = max(0.0, now - episode.since)
        for kind in self._ORDER:
            if kind in episode.done:
                return None  # nothing milder is worth saying after a stronger step
            if self._due(kind, over_seconds):
                episode.done.update(k for k in self._ORDER[self._ORDER.index(kind) :])
                return Action(
                    kind, job_id, used, limit, over_seconds, self._reason(kind, used, limit, over_seconds)
                )
        return None

    def forget(self, job_id: str) -> None:
        """Drop what is known about a job (it ended, or was resumed and gets a fresh start)."""
        self._episodes.pop(job_id, None)

    @staticmethod
    def _reason(kind: ActionKind, used: int, limit: int, over_seconds: float) -> str:
        step = {ActionKind.WARN: "warned", ActionKind.SUSPEND: "suspended", ActionKind.KILL: "killed"}[kind]
        return (
            f"uses {format_size(used)} of its {format_size(limit)} GPU memory slice "
            f"({100 * used / limit:.0f} %) for {over_seconds:.0f} s: {step}"
        )
