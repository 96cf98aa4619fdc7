"""Start jobs under a supervisor, read how they ended, and signal their process groups.

```text
launch ──► python -I supervisor.py --job-dir state_dir/jobs/<id> --record-dir state_dir/records/<id>
               --attempt N -- CMD…                                           (new session = new group)
poll ────► state_dir/records/<id>/exit.json, written by the supervisor when CMD ends (server up or not)
is_alive ► same PID *and* same start, in clock ticks since boot: a recycled PID never passes for a
           running job, and a step of the wall clock (NTP, a VM resumed) changes nothing
terminate(pgid, grace) ► stop.json + SIGTERM to the supervisor; it forwards, waits, then kills the job's
                          container (every process, at once)
suspend / resume / kill ► freeze / thaw / kill the job's container (``containment``: its cgroup, or the
                          supervisor's descendants), found through records/<id>/containment.json, so
                          it works after a server restart and after the supervisor died; the supervisor
                          itself is outside it, never stopped or killed, so it can still record the exit
```

The supervisor makes the container before the job's first exec and ends only when it is empty: a job's
GPUs are held until its last process has ended, a ``setsid`` daemon included.

The job is told its job folder (GPUSLICE_JOB_DIR: its logs, its report file) and nothing of the record
folder, which holds what the supervisor says about it (exit.json, stop.json, the space reserved for the
exit record); an exit record is only believed once the supervisor has ended (the daemon checks), and it
names the attempt it belongs to, so neither a job writing files nor a record left by an earlier attempt
can end a job that still runs.

Everything here runs as the server's user; nothing switches users. Signalling functions return whether
anything was signalled and treat a group that is already gone as done.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpuslice.errors import InternalError
from gpuslice.node import containment, private_files
from gpuslice.node import supervisor as _supervisor
from gpuslice.node.supervisor import (
    EXIT_FILE,
    RESERVE_FILE,
    STDERR_LOG,
    STDOUT_LOG,
    STOP_FILE,
    SUPERVISOR_DEFERRED_SIGNALS,
    write_json_atomic,
)
from gpuslice.workload.job import JobSpec

__all__ = [
    "LAUNCH_FILE",
    "REPORT_FILE",
    "Containment",
    "ExitStatus",
    "LaunchedJob",
    "is_alive",
    "is_stopped",
    "job_dir",
    "kill",
    "launch",
    "launch_records",
    "log_paths",
    "poll",
    "process_start",
    "record_dir",
    "resume",
    "seconds_since",
    "suspend",
    "terminate",
    "was_started",
]

REPORT_FILE = "gpu_report.json"  # where gpuslice-fake-load reports its simulated GPU memory
LAUNCH_FILE = "job.json"  # the caller's account of the launch (``about``): rebuilds a lost store
SUPERVISOR_LOG = "supervisor.log"  # the supervisor's own errors (a crash in it, never the job's output)
_SUPERVISOR_PATH = Path(_supervisor.__file__).resolve()
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A process's start, read from /proc/<pid>/stat (field 22, clock ticks since boot), is exact: two readings
# agree to the tick. Records stored by an older gpuslice hold psutil's create_time instead (seconds since
# the epoch, boot time + start ticks, so it moves with the wall clock); those are compared as before.
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_LEGACY_TOLERANCE_SECONDS = 0.05
# Variables that hold search paths: the value from ``env`` goes in front of the job's own, not over it
# (the loader takes LD_PRELOAD entries separated by ':' as well as by spaces).
_PATH_VARIABLES = ("PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH")

# Supervisors this process started, so they are reaped (no zombies) when is_alive/poll looks at them.
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True, slots=True)
class LaunchedJob:
    """A started job: its supervisor's PID (also its process group), and that process's start time."""

    pid: int
    pgid: int
    start_time: float  # process_start: seconds since boot, from the kernel's start ticks
    containment: str = ""  # the mode its processes are kept together in (``containment.MODES``)


@dataclass(frozen=True, slots=True)
class Containment:
    """How a server keeps its jobs' processes together: the mode it resolved at its start
    (``containment.detect``), the grace leftovers get once a job's main process has ended, and the
    most processes and threads one job may have (0: no limit)."""

    mode: str = containment.AUTO  # auto: each supervisor takes the best mode that works (a probe per job)
    grace_seconds: float = _supervisor.DEFAULT_GRACE_SECONDS
    pids_max: int = 0


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a job's command ended, as the supervisor recorded it in exit.json.

    ``exit_code`` follows the shell: 128 + N when the command died of signal N (then ``signal`` is N),
    126/127 when it could not be started (the reason is in stderr.log)."""

    exit_code: int
    signal: int | None
    finished_at: float
    # when the supervisor started: tells this attempt's record from an older attempt's (older records)
    started_at: float | None = None
    attempt: int | None = None  # the attempt the supervisor was started for (None: an older record)
    stop_forwarded: bool = True  # a stop reached the main process before it ended (older records: yes)
    leftovers: int = 0  # processes still running when the main one ended
    leftovers_killed: int = 0  # of those, killed at the end of the grace
    containment: str = ""
    oom_kills: int = 0  # processes the kernel's OOM killer took for the job's host memory limit

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and self.signal is None

    def text(self) -> str:
        """'exit code 137 (signal 9)', and what the kernel's OOM killer did, for a job's end reason."""
        code = f"exit code {self.exit_code}" + (f" (signal {self.signal})" if self.signal else "")
        if self.oom_kills:
            code += f"; the kernel OOM-killed {self.oom_kills} process(es) over its host memory limit"
        return code

    def leftover_text(self) -> str:
        """What became of the processes left running when the main one ended ('' for none)."""
        if not self.leftovers:
            return ""
        killed = f"{self.leftovers_killed} killed after the grace" if self.leftovers_killed else "none killed"
        return (f"its main process ended with {self.leftovers} process(es) still running: the job ended with "
                f"its last one (SIGTERM, {killed})")  # fmt: skip


def job_dir(state_dir: Path, job_id: str) -> Path:
    """state_dir/jobs/<job_id>; InternalError for an id that is not a plain file name."""
    if not _JOB_ID.match(job_id) or job_id in (".", ".."):
        raise InternalError(f"job id {job_id!r} cannot name a directory: use letters, digits, '.', '_', '-'")
    return Path(state_dir) / "jobs" / job_id


def record_dir(state_dir: Path, job_id: str) -> Path:
    """state_dir/records/<job_id>: the supervisor's exit and stop records, out of the job's sight."""
    job_dir(state_dir, job_id)  # the same check of the id
    return Path(state_dir) / "records" / job_id


def was_started(job_id: str, state_dir: Path) -> bool:
    """Whether a supervisor was ever started for the job's current launch: it reserves the space of its
    exit record first thing, and ``launch`` removes that reservation before starting a new one."""
    directory = record_dir(state_dir, job_id)
    return (directory / RESERVE_FILE).exists() or (directory / EXIT_FILE).exists()


def launch_records(state_dir: Path) -> dict[str, dict[str, object]]:
    """job id -> the ``about`` of its last launch (with "attempt"), for every job launched under
    ``state_dir``; unreadable ones are left out."""
    found: dict[str, dict[str, object]] = {}
    root = Path(state_dir) / "records"
    if not root.is_dir():
        return found
    for directory in root.iterdir():
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((directory / LAUNCH_FILE).read_text(encoding="utf-8"))
            if isinstance(data, dict) and isinstance(data.get("attempt"), int):
                found[directory.name] = data
    return found


def process_start(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since boot (/proc/<pid>/stat field 22 over the clock
    tick), or None if it does not exist. Independent of the wall clock: it never moves for a process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:  # no /proc (not Linux): psutil's create_time, the best there is
        try:
            return psutil.Process(pid).create_time()
        except psutil.Error:
            return None
    # comm (field 2) is in parentheses and may hold spaces or ')': the fields after the last ')' count
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19]) / _CLOCK_TICKS  # field 22 is the 20th after comm and state


def seconds_since(start_time: float) -> float | None:
    """How long ago a ``process_start`` value was, on the boot clock (no wall clock); None for an older
    record's create_time."""
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    return None if start_time > now + 1 else max(0.0, now - start_time)


def log_paths(state_dir: Path, job_id: str) -> tuple[Path, Path]:
    """(stdout.log, stderr.log) of a job."""
    d = job_dir(state_dir, job_id)
    return d / STDOUT_LOG, d / STDERR_LOG


def _job_environment(job_id: str, spec: JobSpec, env: Mapping[str, str], directory: Path) -> dict[str, str]:
    """The server's environment, then the job's own variables (spec.env), then gpuslice's (``env``)."""
    merged = dict(os.environ)
    merged.update(dict(spec.env))
    for key, value in env.items():
        if key in _PATH_VARIABLES and merged.get(key):
            merged[key] = value + os.pathsep + merged[key]
        else:
            merged[key] = value
    merged["GPUSLICE_JOB_ID"] = job_id
    merged["GPUSLICE_JOB_DIR"] = str(directory)
    merged["GPUSLICE_REPORT_FILE"] = str(directory / REPORT_FILE)
    return merged


def launch(
    job_id: str,
    spec: JobSpec,
    env: Mapping[str, str],
    state_dir: Path,
    *,
    attempt: int = 0,
    about: Mapping[str, object] | None = None,
    contain: Containment | None = None,
) -> LaunchedJob:
    """Start ``spec.command`` under a supervisor in a new session; returns at once.

    The job's environment is the server's, then ``spec.env``, then ``env`` (from ``enforcement.job_env``;
    a PYTHONPATH there is put in front of the job's own), plus GPUSLICE_JOB_ID, GPUSLICE_JOB_DIR and
    GPUSLICE_REPORT_FILE. A leftover exit, stop or reserve record from an earlier run of the same job id
    is removed first, and the supervisor writes ``attempt`` into its exit record, so ``poll`` only ever
    reports this run. ``about`` (JSON-able) is written to the record folder first, as job.json, for
    ``launch_records``. ``contain`` says how its processes are kept together (default: the best mode that
    works here); the spec's host limits go to that container.
    """
    contain = contain or Containment()
    directory = job_dir(state_dir, job_id)
    records = record_dir(state_dir, job_id)
    for folder in (directory, records):
        folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder.mkdir(exist_ok=True, mode=0o700)  # the job's output and its env are its user's alone
    # An earlier attempt may have swapped its folder for a link: refused (UnsafeFile) before anything
    # in it is removed or written.
    os.close(private_files.open_folder(directory))
    (directory / REPORT_FILE).unlink(missing_ok=True)
    for stale in (EXIT_FILE, STOP_FILE, RESERVE_FILE, containment.RECORD_FILE):
        (records / stale).unlink(missing_ok=True)
    if about is not None:
        write_json_atomic(records / LAUNCH_FILE, {"attempt": attempt, **about})
    command = [sys.executable, "-I", str(_SUPERVISOR_PATH), "--job-dir", str(directory),
               "--record-dir", str(records), "--attempt", str(attempt)]  # fmt: skip
    command += ["--containment", contain.mode, "--grace", repr(contain.grace_seconds)]
    limits = {"--host-memory": spec.host_memory_bytes, "--cpus": spec.cpus, "--pids-max": contain.pids_max}
    command += [str(part) for flag, value in limits.items() if value for part in (flag, value)]
    if spec.cwd:
        command += ["--cwd", spec.cwd]
    command += ["--", *spec.command]
    # The supervisor starts with SIGTERM/SIGINT blocked (a child inherits its parent thread's signal
    # mask across fork and exec) and unblocks them once its handlers are installed: a job preempted
    # within the ~60 ms of interpreter start-up would otherwise kill the supervisor before it can
    # record anything, and end "lost" instead of preempted.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_DEFERRED_SIGNALS)
    try:
        log_fd = private_files.open_for_append(directory / SUPERVISOR_LOG)  # never through the job's link
        with open(log_fd, "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=_job_environment(job_id, spec, env, directory),
                start_new_session=True,  # own session and group: survives the server, signalled as a group
                close_fds=True,
            )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    _children[process.pid] = process
    start_time = process_start(process.pid)
    if start_time is None:  # cannot happen: an unreaped child keeps its /proc entry until we wait
        raise InternalError(f"the supervisor of job {job_id} (pid {process.pid}) has no /proc entry")
    return LaunchedJob(pid=process.pid, pgid=process.pid, start_time=start_time, containment=contain.mode)


def poll(job_id: str, state_dir: Path) -> ExitStatus | None:
    """The job's exit record, or None while it has none (running, or lost: check ``is_alive``).
    InternalError when the record cannot be read (damage from outside: it is replaced atomically)."""
    path = record_dir(state_dir, job_id) / EXIT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        status = ExitStatus(
            exit_code=int(data["exit_code"]),
            signal=None if data.get("signal") is None else int(data["signal"]),
            finished_at=float(data["finished_at"]),
            started_at=None if data.get("started_at") is None else float(data["started_at"]),
            attempt=None if data.get("attempt") is None else int(data["attempt"]),
            stop_forwarded=bool(data.get("stop_forwarded", True)),
            leftovers=int(data.get("leftovers", 0)),
            leftovers_killed=int(data.get("leftovers_killed", 0)),
            containment=str(data.get("containment", "")),
            oom_kills=int(data.get("oom_kills", 0)),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        # exit.json is replaced atomically, so this is damage from outside, not a half-written file.
        raise InternalError(f"{path} is not a valid exit record ({e}); remove it to mark the job lost") from e
    _reap_all()
    return status


def _reap_all() -> None:
    for pid, process in list(_children.items()):
        if process.poll() is not None:
            del _children[pid]


def is_alive(pid: int, start_time: float) -> bool:
    """True if process ``pid`` runs and started at ``start_time`` (``process_start``): a recycled PID
    does not count, and neither does the wall clock."""
    process = _children.get(pid)
    if process is not None and process.poll() is not None:
        del _children[pid]
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        started = process_start(pid)
        if started is None:
            return False
        if seconds_since(start_time) is None:  # an older record: a create_time
            return abs(p.create_time() - start_time) <= _LEGACY_TOLERANCE_SECONDS
        return abs(started - start_time) < 0.5 / _CLOCK_TICKS
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _supervisor_dir(pgid: int) -> Path | None:
    """The job dir of the supervisor that leads group ``pgid``, or None if no supervisor leads it."""
    try:
        cmdline = psutil.Process(pgid).cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    is_supervisor = any(
        part.endswith(os.path.join("gpuslice", "node", "supervisor.py")) or part == "gpuslice.node.supervisor"
        for part in cmdline
    )
    if not is_supervisor or "--job-dir" not in cmdline:
        return None
    position = cmdline.index("--job-dir") + 1
    return Path(cmdline[position]) if position < len(cmdline) else None


def _supervisor_records(pgid: int) -> Path | None:
    """The record dir of the supervisor that leads group ``pgid`` (its job dir for one started without
    --record-dir, as before), or None if no supervisor leads it."""
    directory = _supervisor_dir(pgid)
    if directory is None:
        return None
    with contextlib.suppress(psutil.Error):
        cmdline = psutil.Process(pgid).cmdline()
        if "--record-dir" in cmdline and cmdline.index("--record-dir") + 1 < len(cmdline):
            return Path(cmdline[cmdline.index("--record-dir") + 1])
    return directory


def _members(pgid: int) -> list[int]:
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(p.pid) == pgid:
                members.append(p.pid)
    return members


def _signal_workers(pgid: int, sig: int) -> bool:
    """``sig`` to every process in the group except its supervisor; all of it if no supervisor leads.

    Two passes: a process forked between the listing and the signal of the first pass is caught by the
    second (a stopped or killed process forks no more)."""
    if _supervisor_dir(pgid) is None:
        try:
            os.killpg(pgid, sig)
            return True
        except ProcessLookupError:
            return False
    sent = False
    for _ in range(2):
        for pid in _members(pgid):
            if pid == pgid:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                sent = True
    return sent


def _container(pgid: int, state_dir: Path | None) -> containment.Container | None:
    """The container of the job whose supervisor is (or was) ``pgid``: from the live supervisor's record
    folder, else from the state dir's records (the supervisor died; then nothing is found through its
    PID, which may be another process's now). None for a job started before containers."""
    records = _supervisor_records(pgid)
    alive = records is not None
    candidates = [records] if records is not None else []
    if records is None and state_dir is not None:
        candidates = sorted((Path(state_dir) / "records").glob("*"))
    for folder in candidates:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            data = json.loads((folder / containment.RECORD_FILE).read_text(encoding="utf-8"))
            if int(data["supervisor"]) == pgid:
                return containment.from_record(data, supervisor_alive=alive)
    return None


def terminate(pgid: int, grace_seconds: float, state_dir: Path | None = None, *, kill: bool = False) -> bool:
    """Ask the job to stop: SIGTERM now, SIGKILL after ``grace_seconds``; returns at once.

    The supervisor does the waiting and the kill (it reads the grace from stop.json), so the
    escalation happens even if the server dies meanwhile. Without a supervisor (it died), the job's
    processes get SIGTERM and SIGCONT directly and the caller must ``kill`` them later. With ``kill`` a
    live supervisor skips the SIGTERM and kills the job's container as soon as it has one."""
    directory = _supervisor_records(pgid)
    try:
        if directory is None:
            found = _container(pgid, state_dir)
            if found is not None:
                found.signal(signal.SIGTERM)
                found.freeze(False)
                return True
            os.killpg(pgid, signal.SIGTERM)
            os.killpg(pgid, signal.SIGCONT)
            return True
        write_json_atomic(
            directory / STOP_FILE, {"grace_seconds": grace_seconds, "requested_at": time.time(), "kill": kill}
        )
        os.kill(pgid, signal.SIGTERM)
        return True
    except (ProcessLookupError, FileNotFoundError):
        return False


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, or a debugger): it acts on no signal until continued."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"T", b"t")


def suspend(pgid: int, state_dir: Path | None = None) -> bool:
    """Freeze the job's processes (the supervisor keeps running, to forward a later SIGTERM)."""
    found = _container(pgid, state_dir)
    if found is None:
        return _signal_workers(pgid, signal.SIGSTOP)
    found.freeze(True)
    return True


def resume(pgid: int, state_dir: Path | None = None) -> bool:
    """Thaw the job's processes and SIGCONT them."""
    found = _container(pgid, state_dir)
    if found is not None:
        found.freeze(False)
    try:
        os.killpg(pgid, signal.SIGCONT)
        return True
    except ProcessLookupError:
        return found is not None


def kill(pgid: int, state_dir: Path | None = None) -> bool:
    """Kill the job's processes now, all at once; the supervisor survives them and writes exit.json
    (signal 9). With the supervisor gone, its container is removed too once empty."""
    found = _container(pgid, state_dir)
    if found is None:
        if _supervisor_records(pgid) is not None:
            # a live supervisor that has not recorded its container yet has not started the job: a stop
            # with no grace makes it kill the job as soon as it has (signalling the group now would hit
            # a process between fork and exec, or the supervisor itself before it leads the group)
            return terminate(pgid, 0.0, kill=True)
        return _signal_workers(pgid, signal.SIGKILL)
    had = found.populated()
    found.kill()
    if found.supervisor <= 0:  # nobody else will remove it
        with contextlib.suppress(OSError):
            found.remove()
    else:
        # A process the supervisor has forked but that has not entered the container yet escaped that
        # kill (on a loaded machine the window is wide enough to hit): a stop with no grace makes the
        # supervisor kill the container again once its child runs inside it.
        terminate(pgid, 0.0, kill=True)
    return had
