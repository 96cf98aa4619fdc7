"""Keep every process a job starts inside one container, so that none outlives the job.

A job ends when its last process has ended, not its first one (Slurm's proctrack/cgroup, systemd's
"a unit is its cgroup"). The supervisor makes the container before the job's first exec and waits for it
to empty; stopping a job kills the whole container at once. Five ways, best first (``detect``):

```text
mode       needs                                 members             atomic kill          host limits
cgroup2    a writable cgroup v2 hierarchy        cgroup.procs,       cgroup.kill          memory.max pids.max
           (mkdir beside the server's cgroup)    cgroup.events                            cpu.max where the
                                                                                          parent delegates
cgroup1    root, the v1 freezer (+ pids, memory, freezer procs       FROZEN, SIGKILL all, memory limit,
           cpu for limits)                                           THAWED (in a loop)   pids.max, cfs quota
systemd    systemd as PID 1: systemd-run --user  the scope's cgroup  cgroup.kill on it    MemoryMax TasksMax
           --scope (delegation, no root)                                                  CPUQuota
subreaper  nothing (any user):                   descendants of the  SIGSTOP every one    none
           PR_SET_CHILD_SUBREAPER                supervisor; else by until none runs,
                                                 GPUSLICE_JOB_SCOPE  then SIGKILL
                                                 in /proc/PID/environ
pgroup     nothing; no containment (to compare)  the process group   SIGKILL each member  none
                                                 (setsid escapes)
```

What each does not guarantee: subreaper finds a process by descent while the supervisor lives, and
after it died only by the variable in its environment (a process that exec'd with a wiped environment
and whose supervisor was killed is not found); pgroup loses any process that calls setsid or setpgid.

The supervisor runs this file with ``python -I`` by path (see supervisor.py), so it imports only the
standard library, like the supervisor.
"""

from __future__ import annotations

import os
from pathlib import Path

if __package__:
    from gpuslice.node import cgroups, proctree
else:  # loaded by path by the supervisor (see supervisor.py)
    import cgroups  # type: ignore[no-redef]
    import proctree  # type: ignore[no-redef]

ContainmentUnavailable = proctree.ContainmentUnavailable
Container = proctree.Container
Limits = proctree.Limits
MARKER_ENV = proctree.MARKER_ENV

__all__ = [
    "AUTO",
    "ENV_MODE",
    "MARKER_ENV",
    "MODES",
    "RECORD_FILE",
    "Container",
    "ContainmentUnavailable",
    "Limits",
    "create",
    "describe",
    "detect",
    "from_record",
    "limits_supported",
]

MODES = ("cgroup2", "cgroup1", "systemd", "subreaper", "pgroup")
AUTO = "auto"
ENV_MODE = "GPUSLICE_CONTAINMENT"  # the mode a server uses when --containment is not given
RECORD_FILE = "containment.json"  # the container, in the job's record folder: the server re-adopts it

_WHAT = {
    "cgroup2": "cgroup v2: every process of the job, setsid or double-forked, is in its cgroup; cancel, "
    "max runtime and leftovers are killed at once with cgroup.kill",
    "cgroup1": "cgroup v1: every process of the job is in its freezer cgroup; a kill freezes it, SIGKILLs "
    "every member and thaws it, so no fork escapes",
    "systemd": "a systemd transient scope (systemd-run --user --scope): systemd keeps every process in "
    "the scope's cgroup; a kill is cgroup.kill on it",
    "subreaper": "no cgroup: the supervisor is a child subreaper and finds every descendant (setsid ones "
    f"too) by descent and by {MARKER_ENV} in its environment; a kill stops them all, then SIGKILLs",
    "pgroup": "no containment: only the supervisor's process group is signalled; a process that calls "
    "setsid escapes and may keep its GPUs",
}


def describe(mode: str) -> str:
    """One sentence: what ``mode`` guarantees (for the server's start line, the job's event, --help)."""
    return _WHAT[mode]


def detect(requested: str = AUTO) -> str:
    """The containment mode to use: ``requested`` if it works here (else ContainmentUnavailable saying
    why), or for "auto" the first of cgroup2, cgroup1, systemd, subreaper that works."""
    if requested != AUTO and requested not in MODES:
        raise ContainmentUnavailable(
            f"containment {requested!r} is not known; known: auto, {', '.join(MODES)}"
        )
    if requested != AUTO:
        why = cgroups.why_not(requested)
        if why is not None:
            raise ContainmentUnavailable(f"containment {requested} is not available here: {why}")
        return requested
    for mode in ("cgroup2", "cgroup1") if os.geteuid() == 0 else ("cgroup2", "systemd"):
        if cgroups.why_not(mode) is None:
            return mode
    return "subreaper"


def limits_supported(mode: str) -> frozenset[str]:
    """Which host limits (memory, cpus, pids) the kernel enforces in ``mode`` on this machine."""
    return cgroups.cgroup_limits(mode)


_CLASSES: dict[str, type[Container]] = {
    "cgroup2": cgroups.CgroupV2, "cgroup1": cgroups.CgroupV1, "systemd": cgroups.SystemdScope,
    "subreaper": proctree.Subreaper, "pgroup": proctree.ProcessGroup,
}  # fmt: skip


def create(mode: str, limits: Limits) -> Container:
    """A new container for a job supervised by this process (ContainmentUnavailable, OSError)."""
    container = _CLASSES[mode](os.getpid(), f"{os.getpid()}-{os.urandom(4).hex()}")
    container.setup(limits)
    return container


def from_record(data: dict[str, object], supervisor_alive: bool) -> Container:
    """The container a record (``Container.record``) describes, to signal or kill from another process.
    ``supervisor_alive``: its PID is still the supervisor's (checked by its start); if not, nothing is
    found through that PID (a recycled one leads to strangers)."""
    mode, marker = str(data["mode"]), str(data["marker"])
    supervisor = int(data["supervisor"]) if supervisor_alive else -1  # type: ignore[call-overload]
    paths = data.get("paths") or {}
    if mode == "cgroup1":
        return cgroups.CgroupV1(supervisor, marker, {k: Path(v) for k, v in dict(paths).items()})  # type: ignore[call-overload]
    if mode in ("cgroup2", "systemd"):
        path = next(iter(paths), None)  # type: ignore[call-overload]
        return _CLASSES[mode](supervisor, marker, None if path in (None, "None") else Path(path))  # type: ignore[call-arg]
    return _CLASSES[mode](supervisor, marker)
