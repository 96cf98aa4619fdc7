"""The per-job supervisor (like slurmstepd or conmon): runs one command and records how it ended.

Run as ``python -m gpuslice.node.supervisor --job-dir DIR [--record-dir DIR] [--attempt N] [--cwd DIR]
[--grace S] [--containment MODE] [--host-memory B] [--cpus N] [--pids-max N] -- CMD…`` (the
launcher runs this file by path with ``python -I``, which is the same program without importing
the gpuslice package, so a job start costs ~60 ms and ~10 MB instead of numpy's import).

```text
launcher (start_new_session) ─► supervisor: session + process-group leader, same user, same env
   supervisor ─► the job's container (containment.py: a cgroup, a systemd scope, or the supervisor as
       child subreaper), recorded in RECORDS/containment.json, then CMD in it (entered before its first
       exec); stdout/stderr appended to DIR/{stdout,stderr}.log
   SIGTERM/SIGINT to the supervisor ─► forwarded to every process of the container, which is then
       thawed and continued (a suspended job must be able to act on it); after the grace period
       (RECORDS/stop.json, else --grace) the whole container is killed at once
   start ───► RECORDS/.exit.reserve: the exit record's space, taken before CMD runs (RECORDS is
              --record-dir, the job dir when not given)
   CMD ends ─► processes left in the container (a setsid daemon, a double fork) get SIGTERM, and the
              container is killed after --grace: the job ends with its last process (they hold GPUs)
           ─► RECORDS/exit.json {"exit_code", "signal", "finished_at", "started_at", "attempt",
              "containment", "leftovers", "leftovers_killed", "stop_forwarded", "oom_kills"} written
              atomically from the reserved space; if that fails too (disk full, no file descriptors)
              the supervisor keeps trying every second and stays alive meanwhile, so the job is seen
              running, never lost, until its true end is on disk
```

Its deadlines (the grace before SIGKILL) run on the monotonic clock: a wall-clock step changes nothing.

The supervisor is outside its job's container, never stopped or killed by the launcher, so
an exit is recorded even when the job is killed, and it is in its own session, so it outlives a
server that is killed: the server finds exit.json when it comes back.

Only the standard library is used here, on purpose (see above).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__:
    from gpuslice.node import containment, private_files
else:  # run by path with ``python -I`` (see above): its sibling files, still without the package
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import containment  # type: ignore[no-redef]
    import private_files  # type: ignore[no-redef]

__all__ = [
    "EXIT_FILE",
    "RESERVE_FILE",
    "STOP_FILE",
    "SUPERVISOR_DEFERRED_SIGNALS",
    "Supervisor",
    "main",
    "write_json_atomic",
]

EXIT_FILE = "exit.json"
RESERVE_FILE = ".exit.reserve"  # the exit record's disk space, taken at start: a full disk later is no matter
_RESERVE_BYTES = 4096
_RETRY_SECONDS = 1.0
# Stop requests the supervisor handles itself; blocked from its start until its handlers are in place.
SUPERVISOR_DEFERRED_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
# written by launcher.terminate: {"grace_seconds": float, "requested_at": float, "kill": bool}; with
# "kill" the job gets no SIGTERM, only the SIGKILL, at once (launcher.kill asks this of a live supervisor)
STOP_FILE = "stop.json"
STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
# workload.job.DEFAULT_GRACE_SECONDS, copied: this file imports only the standard library (see above);
# tests/test_defaults.py checks that the two agree.
DEFAULT_GRACE_SECONDS = 30.0
_POLL_SECONDS = 0.05
# Shell conventions for a command that cannot be started (bash: 126 not executable, 127 not found).
_EXIT_NOT_EXECUTABLE = 126
_EXIT_NOT_FOUND = 127


def write_json_atomic(path: Path, data: dict[str, object]) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # 0600 from the start: the job folder holds the job's output and is its user's alone.
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_exit_record(directory: Path, data: dict[str, object]) -> None:
    """``data`` as ``directory``/exit.json, atomically, from the space ``reserve`` took; without a
    reservation (or if it fails) as any file. OSError if neither works."""
    reserve = directory / RESERVE_FILE
    payload = json.dumps(data).encode()
    try:
        fd = os.open(reserve, os.O_WRONLY)
    except OSError:
        write_json_atomic(directory / EXIT_FILE, data)
        return
    try:
        os.pwrite(fd, payload, 0)  # within blocks already allocated: needs no free space
        os.ftruncate(fd, len(payload))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(reserve, directory / EXIT_FILE)


def reserve(directory: Path) -> None:
    """Take the exit record's disk space now (best effort: a full disk already is retried at the end)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory / RESERVE_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, _RESERVE_BYTES)
            except OSError:  # a file system without fallocate: write the bytes
                os.write(fd, b" " * _RESERVE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)


def _reap_orphans() -> None:
    """Reap children that are not the main process (orphans a subreaper inherits), once the main process
    is reaped: before that, waiting for any child could take the main one's status from Popen."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


class Supervisor:
    """Runs one command in a container of its own (``containment``); ``run()`` returns the exit record
    it wrote, once the command's last process has ended."""

    def __init__(
        self,
        job_dir: Path,
        command: list[str],
        *,
        cwd: str | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        record_dir: Path | None = None,
        attempt: int | None = None,
        mode: str = containment.AUTO,
        limits: containment.Limits | None = None,
    ) -> None:
        self.job_dir = job_dir
        self.record_dir = record_dir or job_dir
        self.attempt = attempt
        self.command = command
        self.cwd = cwd
        self.grace_seconds = grace_seconds
        self.mode = mode
        self.limits = limits or containment.Limits()
        if os.getpgrp() != os.getpid():
            # Started by hand rather than by the launcher: lead a group of our own, so that signalling
            # "the job's group" can never reach whoever started us.
            os.setpgid(0, 0)
        self.pgid = os.getpgrp()
        self._requests: list[int] = []  # signals received, handled in the main loop
        self._kill_at: float | None = None
        self._forwarded = False  # a stop reached the job while its main process still ran
        self.child: subprocess.Popen[bytes] | None = None
        self.container: containment.Container | None = None
        self._recorded: dict[str, object] = {}  # the container record on disk

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._requests.append(signum)  # no work in the handler: the loop acts within _POLL_SECONDS

    def _forward(self, signum: int) -> None:
        """Send ``signum`` to every process of the job (never to ourselves: we are outside its container),
        then continue them (a suspended job must be able to act on it); start the grace clock."""
        grace, kill_now = self.grace_seconds, False
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError):
            stop = json.loads((self.record_dir / STOP_FILE).read_text())
            grace, kill_now = float(stop["grace_seconds"]), stop.get("kill") is True
        if self.child is not None and self.child.poll() is None:
            self._forwarded = True
        if kill_now and signum == signal.SIGTERM:
            grace = 0.0  # the SIGKILL follows in the loop; no SIGTERM first
        elif self.container is not None:
            self.container.signal(signum)
            self.container.freeze(False)
        deadline = time.monotonic() + max(0.0, grace)
        self._kill_at = deadline if self._kill_at is None else min(self._kill_at, deadline)

    def _contain(self, err: int) -> int | None:
        """Make the job's container and record it; on failure say why in stderr.log, return 126."""
        try:
            # the server passes the mode it resolved at its start; by hand, the best one here
            mode = containment.detect() if self.mode == containment.AUTO else self.mode
            self.container = containment.create(mode, self.limits)
        except (containment.ContainmentUnavailable, OSError) as e:
            os.write(err, f"gpuslice: cannot contain the job: {e}\n".encode())
            return _EXIT_NOT_EXECUTABLE
        # before the job's first process: a server that finds this record finds every process of the job.
        # On a full disk the job waits for room (a job started unrecorded could not be found after a restart).
        self._recorded = self.container.record()
        self._retry(
            "the container record",
            lambda: write_json_atomic(self.record_dir / containment.RECORD_FILE, self._recorded),
        )
        return None

    def _start(self, out: int, err: int) -> int | None:
        """Start the command; on failure write why to stderr.log and return the shell's exit code."""
        failed = self._contain(err)
        if failed is not None:
            return failed
        assert self.container is not None
        env = {**os.environ, containment.MARKER_ENV: self.container.marker}
        try:
            self.child = subprocess.Popen(
                self.container.wrap(self.command), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                cwd=self.cwd, close_fds=True, env=env,
                preexec_fn=self.container.enter,  # in the container before the first exec: nothing escapes
            )  # fmt: skip
        except FileNotFoundError as e:
            missing = self.cwd if self.cwd and not os.path.isdir(self.cwd) else self.command[0]
            os.write(err, f"gpuslice: cannot start the job: {missing!r} not found ({e.strerror})\n".encode())
            return _EXIT_NOT_FOUND
        except (PermissionError, OSError, subprocess.SubprocessError) as e:
            os.write(err, f"gpuslice: cannot start {self.command[0]!r}: {e}\n".encode())
            return _EXIT_NOT_EXECUTABLE
        self.container.adopt_main(self.child.pid)
        record = self.container.record()
        if record != self._recorded:  # systemd: the scope's cgroup is known only now
            # best effort: the job runs already, and a disk it filled must not stop us waiting for it;
            # a restart then finds the scope by the job marker in its processes' environment
            try:
                write_json_atomic(self.record_dir / containment.RECORD_FILE, record)
            except OSError as e:
                os.write(err, f"gpuslice: cannot update the container record: {e}\n".encode())
        return None

    def _handle_requests(self) -> None:
        while self._requests:
            self._forward(self._requests.pop(0))
        if self._kill_at is not None and time.monotonic() >= self._kill_at and self.container is not None:
            self.container.kill()  # every process of the job at once
            self._kill_at = None

    def _wait(self) -> int:
        assert self.child is not None
        while True:
            self._handle_requests()
            try:
                return self.child.wait(timeout=_POLL_SECONDS * 4)
            except subprocess.TimeoutExpired:
                continue

    def _wait_leftovers(self) -> tuple[int, int]:
        """The main process ended: the job ends when its last process has. Leftovers get SIGTERM now and
        SIGKILL (all at once) after the grace, or at the stop's deadline. Returns (left, killed)."""
        if self.container is None or not self.container.populated():
            return 0, 0  # populated(), not an empty listing: a re-forker's listing can be empty between
            # a parent's exit and its child's start (cgroup.procs is read in pieces)
        left = self.container.members()
        self.container.signal(signal.SIGTERM)
        self.container.freeze(False)
        deadline = time.monotonic() + max(0.0, self.grace_seconds)
        self._kill_at = deadline if self._kill_at is None else min(self._kill_at, deadline)
        while self.container.populated():
            _reap_orphans()
            if self._kill_at is not None and time.monotonic() >= self._kill_at:
                killed = len(self.container.members())
                self._kill_until_empty()
                return len(left), killed
            while self._requests:
                self._forward(self._requests.pop(0))
            time.sleep(_POLL_SECONDS)
        return len(left), 0

    def _kill_until_empty(self) -> None:
        """Kill the container's processes until none is left: the job is recorded as ended only then,
        since its GPU slice is given to the next job at that moment. One kill gives up after its rounds
        (``KILL_ROUNDS_SECONDS``: a process forking faster than a loaded machine freezes it, or one in D
        state); it is tried again, and the job stays running to whoever looks until it is empty."""
        assert self.container is not None
        self.container.kill()
        while self.container.populated():
            _reap_orphans()
            time.sleep(_POLL_SECONDS)
            self.container.kill()

    def run(self) -> dict[str, object]:
        for sig in SUPERVISOR_DEFERRED_SIGNALS:
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal; the server going away is not an end
        # The launcher starts us with these blocked; a stop requested during start-up was held pending
        # and reaches _on_signal now, before the command starts (the command must not inherit the mask).
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SUPERVISOR_DEFERRED_SIGNALS)
        self.job_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.record_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        reserve(self.record_dir)
        started_at = time.time()
        # Never through a link the job left in its folder (a restart would append to what it points at).
        out = private_files.open_for_append(self.job_dir / STDOUT_LOG)
        err = private_files.open_for_append(self.job_dir / STDERR_LOG)
        try:
            failed_start = self._start(out, err)
            returncode = failed_start if failed_start is not None else self._wait()
        finally:
            os.close(out)
            os.close(err)
        left, killed = self._wait_leftovers()
        _reap_orphans()
        sig = -returncode if returncode < 0 else None
        record: dict[str, object] = {
            "exit_code": 128 + sig if sig is not None else returncode,  # shell convention for a signal
            "signal": sig,
            "finished_at": time.time(),
            "started_at": started_at,
            # whether a stop (cancel, preemption, limit) reached the main process before it ended: one
            # that exited 0 on its own is a success, whatever was asked of it meanwhile
            "stop_forwarded": self._forwarded,
            "leftovers": left,  # processes still running when the main one ended
            "leftovers_killed": killed,  # of those, still running at the end of the grace: SIGKILL
        }
        if self.container is not None:
            record["containment"] = self.container.mode
            record["oom_kills"] = self.container.oom_kills()
            with contextlib.suppress(OSError):
                self.container.remove()
        if self.attempt is not None:
            record["attempt"] = self.attempt
        self._record(record)
        return record

    def _record(self, record: dict[str, object]) -> None:
        """Write the exit record; until it is on disk this process lives, so the job is running to whoever
        looks, not lost."""
        self._retry("the exit record", lambda: write_exit_record(self.record_dir, record))

    def _retry(self, what: str, write: Callable[[], None]) -> None:
        """``write()`` until it succeeds, every second while the disk is full or descriptors are out;
        the first failure is said once on stderr."""
        complained = False
        while True:
            try:
                write()
                return
            except OSError as err:
                if not complained:
                    complained = True
                    with contextlib.suppress(OSError):
                        sys.stderr.write(f"gpuslice supervisor: cannot write {what} yet ({err}); "
                                         "retrying every second\n")  # fmt: skip
                        sys.stderr.flush()
                time.sleep(_RETRY_SECONDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuslice.node.supervisor", description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True, type=Path, help="directory for logs and exit.json")
    parser.add_argument("--record-dir", default=None, type=Path,
                        help="directory for exit.json and stop.json (default: the job dir)")  # fmt: skip
    parser.add_argument("--attempt", default=None, type=int, help="the attempt number, copied into exit.json")
    parser.add_argument("--cwd", default=None, help="working directory of the command")
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_SECONDS,
        help="seconds between SIGTERM and SIGKILL when stop.json does not say",
    )
    parser.add_argument("--containment", default=os.environ.get(containment.ENV_MODE, containment.AUTO),
                        choices=(containment.AUTO, *containment.MODES),
                        help="how the job's processes are kept together (see containment.py)")  # fmt: skip
    parser.add_argument("--host-memory", type=int, default=0, help="bytes of host memory (cgroup), 0: none")
    parser.add_argument("--cpus", type=float, default=0.0, help="CPUs of time per period (cgroup), 0: none")
    parser.add_argument("--pids-max", type=int, default=0, help="processes and threads at most, 0: none")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: use -- CMD …")
    record = Supervisor(
        args.job_dir,
        command,
        cwd=args.cwd,
        grace_seconds=args.grace,
        record_dir=args.record_dir,
        attempt=args.attempt,
        mode=args.containment,
        limits=containment.Limits(args.host_memory, args.cpus, args.pids_max),
    ).run()
    return int(record["exit_code"])  # type: ignore[call-overload]


if __name__ == "__main__":
    sys.exit(main())
