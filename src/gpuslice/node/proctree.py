"""Job containers made of processes, not cgroups: the base every container follows (``Container``), the
process-group way (``ProcessGroup``: no containment, kept to compare) and the child subreaper
(``Subreaper``), plus the /proc reading they share with the cgroup containers (``cgroups.py``).

Standard library only: the supervisor loads this file by path (see supervisor.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MARKER_ENV", "Container", "ContainmentUnavailable", "Limits", "ProcessGroup", "Subreaper"]

MARKER_ENV = "GPUSLICE_JOB_SCOPE"  # in every job process's environment: finds them by /proc/PID/environ
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
POLL = 0.01
KILL_ROUNDS_SECONDS = 10.0  # a kill that cannot empty the container in this long gives up (D state)


class ContainmentUnavailable(Exception):
    """The mode asked for cannot work here; the message says why and what to do."""


@dataclass(frozen=True)
class Limits:
    """Host limits for one job, enforced by the kernel through its cgroup; 0 = none."""

    memory_bytes: int = 0
    cpus: float = 0.0
    pids_max: int = 0

    def asked(self) -> list[str]:
        return [
            n for n, v in (("memory", self.memory_bytes), ("cpus", self.cpus), ("pids", self.pids_max)) if v
        ]


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[2])


def _pids() -> list[int]:
    with contextlib.suppress(OSError):
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    return []


def _last_pid() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    return None


def _pid_max() -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    return 32768


def _and_newer() -> Iterator[int]:
    """Every PID in /proc, then every PID the kernel handed out since the listing began, until a pass
    finds no newer one (ns_last_pid: the kernel's cursor, which wraps at pid_max). A process that forks
    and exits every millisecond has moved past a listing by the end of a scan; probing one PID takes
    microseconds, so this catches up with it."""
    cursor = _last_pid()
    yield from _pids()
    if cursor is None:
        return
    top = _pid_max()
    for _ in range(64):
        last = _last_pid()
        if last is None or last == cursor:
            return
        pid = cursor
        while pid != last:
            pid = pid + 1 if pid < top - 1 else 1
            if os.path.exists(f"/proc/{pid}"):
                yield pid
        cursor = last


def live(pids: list[int]) -> list[int]:
    """Those of ``pids`` that exist and are not zombies (a zombie holds nothing but its PID)."""
    out = []
    for pid in pids:
        info = _stat(pid)
        if info is not None and info[0] not in ("Z", "X"):
            out.append(pid)
    return out


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_pids(path: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(x) for x in path.read_text().split()]
    return []


class Container:
    """One job's processes. ``enter`` runs in the job's first process before its exec (preexec_fn);
    everything else may run in the supervisor or, from the record, in the server."""

    mode = ""

    def __init__(self, supervisor: int, marker: str) -> None:
        self.supervisor = supervisor  # never a member: it records the exit
        self.marker = marker

    def record(self) -> dict[str, object]:
        return {"mode": self.mode, "supervisor": self.supervisor, "marker": self.marker}

    def setup(self, limits: Limits) -> None:
        """Make the container and apply ``limits`` (ContainmentUnavailable if one cannot be)."""
        if limits.asked():
            raise ContainmentUnavailable(
                f"containment {self.mode} cannot enforce host limits ({', '.join(limits.asked())})"
            )

    def wrap(self, command: list[str]) -> list[str]:
        return command

    def enter(self) -> None:
        """In the job's first process, before exec."""

    def adopt_main(self, pid: int) -> None:
        """In the supervisor, once the job's first process exists."""

    def members(self) -> list[int]:
        raise NotImplementedError

    def signal(self, sig: int) -> None:
        """``sig`` to every member (a courtesy: not atomic; ``kill`` is)."""
        signal_all(self.members(), sig)

    def freeze(self, frozen: bool) -> None:
        """Stop (or continue) every member."""
        self._stop_all() if frozen else signal_all(self.members(), signal.SIGCONT)

    def _stop_all(self) -> list[int]:
        """SIGSTOP members until a listing finds none running: a stopped process forks no more."""
        deadline = time.monotonic() + KILL_ROUNDS_SECONDS
        while True:
            found = self.members()
            running = [p for p in found if (_stat(p) or ("T",))[0] not in ("T", "t")]
            if not running or time.monotonic() > deadline:
                return found
            signal_all(running, signal.SIGSTOP)
            time.sleep(POLL / 10)

    def kill(self) -> None:
        """SIGKILL every member at once; returns when none is left (or after a bounded time)."""
        deadline = time.monotonic() + KILL_ROUNDS_SECONDS
        while time.monotonic() < deadline:
            found = self._stop_all()
            if not found:
                return
            signal_all(found, signal.SIGKILL)
            time.sleep(POLL)

    def populated(self) -> bool:
        return bool(self.members())

    def oom_kills(self) -> int:
        return 0

    def remove(self) -> None:
        """Remove what ``setup`` made (the container must be empty)."""


class ProcessGroup(Container):
    mode = "pgroup"

    def setup(self, limits: Limits) -> None:
        super().setup(limits)

    def members(self) -> list[int]:
        return [
            p
            for p in live(_pids())
            if p != self.supervisor and (_stat(p) or ("", 0, 0))[2] == self.supervisor
        ]

    def kill(self) -> None:  # the process-group way, as it always was: each member, no stopping first
        signal_all(self.members(), signal.SIGKILL)


class Subreaper(Container):
    mode = "subreaper"

    def setup(self, limits: Limits) -> None:
        super().setup(limits)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise ContainmentUnavailable(
                f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
            )

    def members(self) -> list[int]:
        return self._scan(stop=False)

    def _stop_all(self) -> list[int]:
        """SIGSTOP members as the scan finds them, until two scans in a row find none running: a process
        that forks and exits every millisecond is caught by its PID right after its parent's, not after a
        whole scan of /proc (by which time it has moved on)."""
        deadline, quiet = time.monotonic() + KILL_ROUNDS_SECONDS, 0
        while quiet < 2 and time.monotonic() < deadline:
            found = self._scan(stop=True)
            running = [p for p in found if (_stat(p) or ("T",))[0] not in ("T", "t")]
            quiet = quiet + 1 if not running else 0
        return self._scan(stop=False)

    def _learn(self, pid: int, parents: dict[int, int], members: set[int]) -> None:
        """Read ``pid``'s ancestry now, a few levels up, into ``parents`` and ``members``."""
        chain = []
        while pid > 1 and pid not in parents and pid != self.supervisor and len(chain) < 8:
            info = _stat(pid)
            if info is None:
                return
            parents[pid] = info[1]
            chain.append(pid)
            pid = info[1]
        if pid == self.supervisor or pid in members:
            members.update(chain)

    def _scan(self, stop: bool) -> list[int]:
        """Descendants of the supervisor (orphans come back to it: it is their subreaper), found in PID
        order so that a child is judged by its parent's verdict at once; when the supervisor is gone (the
        server asks), every process whose environment carries the job's marker. PIDs a little above the
        highest listed are looked at too: they were made during the scan."""
        members: set[int] = set()
        parents: dict[int, int] = {}
        unsure: list[int] = []
        found: list[int] = []
        for pid in _and_newer():
            info = _stat(pid)
            if info is None or pid == self.supervisor:
                continue
            state, parent, _ = info
            parents[pid] = parent
            if self.supervisor > 0 and parent not in parents and parent not in members:
                self._learn(parent, parents, members)  # a parent made after the listing, or not read yet
            if self.supervisor > 0 and (parent == self.supervisor or parent in members):
                members.add(pid)
                if state not in ("Z", "X"):
                    found.append(pid)
                    if stop:
                        signal_all([pid], signal.SIGSTOP)
            elif state not in ("Z", "X"):
                unsure.append(pid)
        wanted = f"{MARKER_ENV}={self.marker}".encode()
        for pid in unsure:
            chain, p = 0, parents.get(pid, 0)
            while p in parents and p not in members and chain < 4096:
                p, chain = parents[p], chain + 1
            if self.supervisor > 0 and (p in members or p == self.supervisor):
                found.append(pid)
                continue
            if self.supervisor <= 0:
                with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as f:
                    if wanted in f.read().split(b"\0"):
                        found.append(pid)
        if stop:
            signal_all(found, signal.SIGSTOP)
        return sorted(set(found))
