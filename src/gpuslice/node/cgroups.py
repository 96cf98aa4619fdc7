"""Job containers that are cgroups: v2 (``CgroupV2``), a systemd transient scope (``SystemdScope``, a v2
cgroup that systemd makes and delegates) and v1 (``CgroupV1``: freezer for membership, pids, memory and
cpu for limits); where each hierarchy is and whether this process may make cgroups in it.

Standard library only: the supervisor loads this file by path (see supervisor.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

if __package__:
    from gpuslice.node.proctree import (
        KILL_ROUNDS_SECONDS,
        POLL,
        Container,
        ContainmentUnavailable,
        Limits,
        live,
        read_pids,
        signal_all,
        write,
    )  # fmt: skip
else:  # loaded by path by the supervisor (see supervisor.py)
    from proctree import (  # type: ignore[no-redef]
        KILL_ROUNDS_SECONDS,
        POLL,
        Container,
        ContainmentUnavailable,
        Limits,
        live,
        read_pids,
        signal_all,
        write,
    )  # fmt: skip

__all__ = ["CgroupV1", "CgroupV2", "SystemdScope", "cgroup_limits", "v1_parents", "v2_parent", "why_not"]

_V1_CONTROLLERS = ("freezer", "pids", "memory", "cpu")  # freezer is the membership; the rest are limits
_CFS_PERIOD_US = 100_000


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, file system type, super options) of every cgroup mount, from /proc/self/mountinfo."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) > 4 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                found.append((fields[4].replace("\\040", " "), tail[0], tail[2]))
    return found


def _own_paths(pid: int | str = "self") -> dict[str, str]:
    """Controller (or "" for v2) -> the process's cgroup path, from /proc/PID/cgroup."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name.removeprefix("name=")] = path
    return paths


def v2_parent() -> Path | None:
    mount = next((m for m, kind, _ in _mounts() if kind == "cgroup2"), None)
    own = _own_paths().get("")
    return None if mount is None or own is None else Path(mount) / own.lstrip("/")


def v1_parents() -> dict[str, Path]:
    own = _own_paths()
    parents = {}
    for mount, kind, options in _mounts():
        for name in options.split(","):
            if kind == "cgroup" and name in _V1_CONTROLLERS and name in own:
                parents[name] = Path(mount) / own[name].lstrip("/")
    return parents


def _probe(parent: Path | None, needs: str = "") -> str | None:
    """Why a child cgroup cannot be made under ``parent`` or lacks the file ``needs`` (None: it can)."""
    if parent is None:
        return "no such hierarchy is mounted"
    probe = parent / f"gpuslice-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as err:
        return f"cannot create a cgroup in {parent} ({err.strerror})"
    try:
        if needs and not (probe / needs).exists():
            return f"cgroups in {parent} have no {needs} (Linux 5.14 or later has it)"
        return None
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _systemd_pid1() -> bool:
    with contextlib.suppress(OSError):
        return Path("/proc/1/comm").read_text().strip() == "systemd"
    return False


def _which(program: str) -> str | None:
    for folder in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        candidate = Path(folder) / program
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def why_not(mode: str) -> str | None:
    if mode == "cgroup2":
        return _probe(v2_parent(), "cgroup.kill")
    if mode == "cgroup1":
        if os.geteuid() != 0:
            return "cgroup v1 needs root (its hierarchies are not delegated to users)"
        parents = v1_parents()
        return "the v1 freezer is not mounted" if "freezer" not in parents else _probe(parents["freezer"])
    if mode == "systemd":
        if not _systemd_pid1():
            return "PID 1 is not systemd"
        if _which("systemd-run") is None:
            return "systemd-run is not on PATH"
        return None
    return None  # subreaper and pgroup work everywhere


def cgroup_limits(mode: str) -> frozenset[str]:
    """Which host limits (memory, cpus, pids) the kernel enforces in ``mode`` on this machine."""
    if mode == "cgroup1":
        parents = v1_parents()
        return frozenset(
            n for n, c in (("memory", "memory"), ("cpus", "cpu"), ("pids", "pids")) if c in parents
        )
    if mode == "cgroup2":
        parent = v2_parent()
        with contextlib.suppress(OSError, TypeError):
            delegated = set((parent / "cgroup.subtree_control").read_text().split())  # type: ignore[operator]
            return frozenset(
                n for n, c in (("memory", "memory"), ("cpus", "cpu"), ("pids", "pids")) if c in delegated
            )
        return frozenset()
    if mode == "systemd":
        return frozenset({"memory", "cpus", "pids"})
    return frozenset()


class _Cgroup(Container):
    """A cgroup v2 directory (cgroup2, systemd)."""

    def __init__(self, supervisor: int, marker: str, path: Path | None = None) -> None:
        super().__init__(supervisor, marker)
        self.path = path

    def record(self) -> dict[str, object]:
        return {**super().record(), "paths": [str(self.path)]}

    def members(self) -> list[int]:
        assert self.path is not None
        return live(read_pids(self.path / "cgroup.procs"))

    def populated(self) -> bool:
        assert self.path is not None
        try:
            return "populated 1" in (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False
        except OSError:
            return bool(self.members())

    def freeze(self, frozen: bool) -> None:
        assert self.path is not None
        with contextlib.suppress(FileNotFoundError):
            write(self.path / "cgroup.freeze", "1" if frozen else "0")
        if not frozen:
            self.signal(signal.SIGCONT)

    def kill(self) -> None:
        assert self.path is not None
        deadline = time.monotonic() + KILL_ROUNDS_SECONDS
        while self.populated() and time.monotonic() < deadline:
            try:
                write(self.path / "cgroup.kill", "1")  # the kernel kills every member, forks included
            except FileNotFoundError:
                return
            except OSError:  # a kernel before 5.14: stop every member, then SIGKILL them
                super().kill()
            time.sleep(POLL)

    def oom_kills(self) -> int:
        assert self.path is not None
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / "memory.events").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        return 0

    def remove(self) -> None:
        if self.path is not None:
            _rmdir(self.path)


class CgroupV2(_Cgroup):
    mode = "cgroup2"

    def setup(self, limits: Limits) -> None:
        missing = set(limits.asked()) - cgroup_limits(self.mode)
        if missing:
            raise ContainmentUnavailable(
                f"host limits {', '.join(sorted(missing))} need their cgroup v2 controller delegated to "
                f"{v2_parent()} (cgroup.subtree_control); it is not"
            )
        parent = v2_parent()
        assert parent is not None
        self.path = parent / f"gpuslice-{self.marker}"
        self.path.mkdir(mode=0o755)
        try:
            if limits.memory_bytes:
                write(self.path / "memory.max", str(limits.memory_bytes))
                with contextlib.suppress(OSError):
                    write(self.path / "memory.swap.max", "0")
            if limits.pids_max:
                write(self.path / "pids.max", str(limits.pids_max))
            if limits.cpus:
                write(self.path / "cpu.max", f"{int(limits.cpus * _CFS_PERIOD_US)} {_CFS_PERIOD_US}")
        except OSError:
            self.remove()
            raise

    def enter(self) -> None:
        assert self.path is not None
        write(self.path / "cgroup.procs", "0")  # "0": the writing process itself


class SystemdScope(_Cgroup):
    """A transient scope made by ``systemd-run --user --scope`` (the D-Bus StartTransientUnit call): the
    job's first process is systemd-run itself, which asks the user's systemd to put it in the scope and
    then execs the command. Its cgroup (delegated to the user) is then used like cgroup2's."""

    mode = "systemd"

    def setup(self, limits: Limits) -> None:
        self._limits = limits

    @property
    def unit(self) -> str:
        return f"gpuslice-{self.marker}.scope"

    def wrap(self, command: list[str]) -> list[str]:
        properties = []
        if self._limits.memory_bytes:
            properties += ["-p", f"MemoryMax={self._limits.memory_bytes}"]
        if self._limits.pids_max:
            properties += ["-p", f"TasksMax={self._limits.pids_max}"]
        if self._limits.cpus:
            properties += ["-p", f"CPUQuota={round(self._limits.cpus * 100)}%"]
        user = [] if os.geteuid() == 0 else ["--user"]
        return ["systemd-run", *user, "--scope", "--quiet", "--collect", f"--unit={self.unit[:-6]}",
                *properties, "--", *command]  # fmt: skip

    def adopt_main(self, pid: int) -> None:
        """Wait until systemd has moved the first process into the scope, and take the scope's cgroup."""
        mount = next((m for m, kind, _ in _mounts() if kind == "cgroup2"), "/sys/fs/cgroup")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            path = _own_paths(pid).get("")
            if path is None:  # it ended (systemd-run failed: its reason is in stderr.log)
                return
            if path.endswith("/" + self.unit):
                self.path = Path(mount) / path.lstrip("/")
                return
            time.sleep(POLL)

    def members(self) -> list[int]:
        return [] if self.path is None else super().members()

    def remove(self) -> None:
        pass  # --collect: systemd removes a scope when it empties


class CgroupV1(Container):
    mode = "cgroup1"

    def __init__(self, supervisor: int, marker: str, paths: dict[str, Path] | None = None) -> None:
        super().__init__(supervisor, marker)
        self.paths = paths or {}

    def record(self) -> dict[str, object]:
        return {**super().record(), "paths": {k: str(v) for k, v in self.paths.items()}}

    def setup(self, limits: Limits) -> None:
        missing = set(limits.asked()) - cgroup_limits(self.mode)
        if missing:
            raise ContainmentUnavailable(
                f"host limits {', '.join(sorted(missing))}: that v1 controller is not mounted"
            )
        parents = v1_parents()
        wanted = ["freezer"] + [c for n, c in (("memory", "memory"), ("cpus", "cpu"), ("pids", "pids"))
                                if n in limits.asked() and c in parents]  # fmt: skip
        try:
            for controller in wanted:
                path = parents[controller] / f"gpuslice-{self.marker}"
                path.mkdir(mode=0o755)
                self.paths[controller] = path
            if limits.memory_bytes:
                write(self.paths["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes))
                with contextlib.suppress(OSError):  # no swap accounting: the limit is RAM alone
                    write(self.paths["memory"] / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            if limits.pids_max:
                write(self.paths["pids"] / "pids.max", str(limits.pids_max))
            if limits.cpus:
                write(self.paths["cpu"] / "cpu.cfs_period_us", str(_CFS_PERIOD_US))
                write(self.paths["cpu"] / "cpu.cfs_quota_us", str(int(limits.cpus * _CFS_PERIOD_US)))
        except OSError:
            self.remove()
            raise

    def enter(self) -> None:
        for path in self.paths.values():
            write(path / "cgroup.procs", "0")

    def members(self) -> list[int]:
        return live(read_pids(self.paths["freezer"] / "cgroup.procs"))

    def _set_state(self, state: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            write(self.paths["freezer"] / "freezer.state", state)

    def freeze(self, frozen: bool) -> None:
        self._set_state("FROZEN" if frozen else "THAWED")
        if not frozen:
            self.signal(signal.SIGCONT)

    def _wait_frozen(self, by: float) -> None:
        """Until the freezer says FROZEN, or ``by`` (a member in D state never freezes)."""
        with contextlib.suppress(OSError):
            while (self.paths["freezer"] / "freezer.state").read_text().strip() != "FROZEN":
                if time.monotonic() > by:
                    return
                time.sleep(POLL / 10)

    def populated(self) -> bool:
        """Whether any process is in the container. An empty listing is confirmed with the members frozen:
        v1's cgroup.procs is read in pieces, and a process that forks a child and exits every millisecond
        can be missed between them (the job was then recorded as ended while it ran on)."""
        if self.members():
            return True
        self._set_state("FROZEN")  # nobody forks or exits while the listing is read again
        try:
            self._wait_frozen(time.monotonic() + 1.0)
            return bool(self.members())
        finally:
            self._set_state("THAWED")

    def kill(self) -> None:
        deadline = time.monotonic() + KILL_ROUNDS_SECONDS
        while self.populated() and time.monotonic() < deadline:
            self._set_state("FROZEN")  # no member runs, so none forks between the listing and the kill
            # a loaded machine may take seconds to schedule every member into the freezer; waiting only 1 s
            # then killing the listed ones let a re-forker's unlisted child run on after the thaw
            self._wait_frozen(min(deadline, time.monotonic() + 5.0))
            signal_all(self.members(), signal.SIGKILL)
            self._set_state("THAWED")  # a frozen process dies of SIGKILL only once thawed
            time.sleep(POLL)

    def oom_kills(self) -> int:
        if "memory" not in self.paths:
            return 0
        with contextlib.suppress(OSError, ValueError):
            for line in (self.paths["memory"] / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        return 0

    def remove(self) -> None:
        for path in self.paths.values():
            _rmdir(path)


def _rmdir(path: Path) -> None:
    """Remove an emptied cgroup; its last members may take a moment to leave it after their death (on a
    loaded machine, seconds: a SIGKILLed process is gone from the cgroup only once it has exited)."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL)
