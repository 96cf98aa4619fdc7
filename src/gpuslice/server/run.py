"""Wire a server together and run it: state dir, lock, token, machine, store, daemon, API, uvicorn.

``gpuslice serve`` (cli/serve.py) calls ``run``; tests and the benchmark start the same thing as a
subprocess. One server per state directory: a second one is refused while the first holds the lock
(the lock is an flock, so a server killed with ``kill -9`` leaves nothing to clean up).

The state directory holds secrets (the token, jobs' env and logs): it must belong to the server's user
and is forced to mode 0700 at every start, and every file the server or a job's supervisor makes in it
is 0600 (folders 0700): each is created with its mode (SQLite gives its -wal and -shm files the mode
of the database file, so that one is made 0600 first). Files a job's command makes are its own affair.

SIGINT and SIGTERM both stop the server cleanly: the daemon loop ends, the store is closed (its WAL
checkpointed), and the node cleans up (MPS daemon, idle MIG instances) before the process exits 0.
Log followers end at once; requests under way get ``SHUTDOWN_GRACE_SECONDS`` (5 s) to finish, then
are cancelled; a second SIGTERM or SIGINT cuts that grace short. Jobs keep running; the next start
adopts them.

Before any request is authenticated its cost is bounded: HTTP/1.1 by h11 with a request head of at most
``MAX_HEAD_BYTES`` (64 KiB: a longer one is refused with 400 before it is buffered), a connection that
has not sent a whole request head within ``IDLE_SECONDS`` (5 s, also the keep-alive) is closed, and
connections beyond ``connection_cap()`` (the descriptor limit, raised to its hard maximum, less a
reserve for the store, job launches and logs) are closed as they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import resource
import signal
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import h11
import psutil
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from gpuslice.errors import InvalidRequest
from gpuslice.inputs import bind_refused, check_listen_host
from gpuslice.node import containment
from gpuslice.node.enforcement import DEFAULT_SHARING
from gpuslice.node.launcher import Containment
from gpuslice.policies import DEFAULT_PLACEMENT
from gpuslice.policies.queue import DEFAULT_QUEUE_POLICY
from gpuslice.programs.guard import GuardConfig
from gpuslice.server.app import create_app
from gpuslice.server.auth import TOKEN_FILE, TokenFile, load_or_create_token
from gpuslice.server.client import DEFAULT_PORT
from gpuslice.server.daemon import DEFAULT_TICK_SECONDS, Daemon
from gpuslice.server.errors import PortTaken, StoreUnavailable
from gpuslice.server.guard import new_sign_in_token
from gpuslice.server.local_node import LocalNode
from gpuslice.server.store import DEFAULT_BUSY_SECONDS, Store
from gpuslice.server.url_file import write_url
from gpuslice.workload.job import DEFAULT_GRACE_SECONDS, JobState
from gpuslice.workload.target import TargetWorkload

__all__ = [
    "IDLE_SECONDS",
    "MAX_HEAD_BYTES",
    "SHUTDOWN_GRACE_SECONDS",
    "ServeOptions",
    "check_pids_max",
    "connection_cap",
    "listen",
    "own_names",
    "run",
    "secure_state_dir",
    "state_lock",
]

_log = logging.getLogger("gpuslice.server")
STORE_FILE = "gpuslice.db"
LOCK_FILE = "server.lock"
SHUTDOWN_GRACE_SECONDS = 5
IDLE_SECONDS = 5
MAX_HEAD_BYTES = 64 * 1024
# Descriptors kept for the server's own work when connections are counted against the limit: the store,
# a launch's pipes and log files, telemetry.
_FD_RESERVE = 256
_MAX_CONNECTIONS = 4096


def connection_cap() -> int:
    """How many client connections the server keeps open at once: the soft descriptor limit (raised to
    the hard one, at most 65536) less a reserve, between 64 and 4096."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    limit = _MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else soft - _FD_RESERVE
    return max(64, min(_MAX_CONNECTIONS, limit))


class _BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with two bounds more: a connection over ``cap`` is closed as it comes,
    and a request head must be whole within ``IDLE_SECONDS`` of its first byte, or of the connection
    (uvicorn times out only the wait after a response, and stops timing at the first byte)."""

    cap = _MAX_CONNECTIONS
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.cap:
            transport.close()
            return
        self._time_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._time_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _time_head(self) -> None:
        waiting = self.conn.their_state is h11.IDLE  # no whole request head yet
        if waiting and self._head_timer is None:
            self._head_timer = self.loop.call_later(IDLE_SECONDS, self._head_too_slow)
        elif not waiting and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


class _Server(uvicorn.Server):
    """uvicorn's server, whose first stop signal also ends the log followers (``stopping``) and whose
    second one ends the grace (uvicorn forces only on a second SIGINT)."""

    def __init__(self, config: uvicorn.Config, stopping: threading.Event) -> None:
        super().__init__(config)
        self.stopping = stopping

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            self.force_exit = True
        self.stopping.set()
        super().handle_exit(sig, frame)


def server_config(app: Any, host: str, port: int) -> uvicorn.Config:
    """The uvicorn settings that bound what an unauthenticated client can make the server hold."""
    cap = connection_cap()
    _BoundedH11.cap = cap
    return uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, http=_BoundedH11,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES, timeout_keep_alive=IDLE_SECONDS,
        limit_concurrency=cap + 64, timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
    )  # fmt: skip


@dataclass(frozen=True)
class ServeOptions:
    state_dir: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    simulate: str | None = None
    sharing: str = DEFAULT_SHARING.value
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    tick_seconds: float = DEFAULT_TICK_SECONDS
    busy_seconds: float = DEFAULT_BUSY_SECONDS  # the longest a call waits for the state file's lock
    queue_policy: str = DEFAULT_QUEUE_POLICY
    placement: str = DEFAULT_PLACEMENT  # a placement policy name or file
    target: TargetWorkload | None = None  # what FGD-style placement keeps room for
    public_reads: bool = False  # reads without the token, as before (a machine with one trusted user)
    allow_hosts: tuple[str, ...] = ()  # Host names accepted besides the server's own ("*": any)
    containment: str = containment.AUTO  # how jobs' processes are kept together (node/containment.py)
    pids_max: int = 0  # processes and threads one job may have (its cgroup's pids.max); 0: no limit
    policy_memory_bytes: int = GuardConfig.memory_limit_bytes  # each policy file's worker: RLIMIT_AS

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def secure_state_dir(state_dir: Path) -> None:
    """Create ``state_dir`` (0700) or check it is ours and force it to 0700, with every file in it 0600
    and every folder 0700 (a state dir made by an older server, or by hand with mode 0755).
    InvalidRequest for a state dir that belongs to another user."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = state_dir.stat()
    if info.st_uid != os.geteuid():
        raise InvalidRequest(
            f"state dir {state_dir} belongs to user id {info.st_uid}, not to you ({os.geteuid()}); "
            "every user runs their own server: pass --state-dir with a folder of your own"
        )
    os.chmod(state_dir, 0o700)
    for root, dirs, files in os.walk(state_dir):
        for name in dirs:
            _chmod_own(Path(root) / name, 0o700)
        for name in files:
            _chmod_own(Path(root) / name, 0o600)


def _chmod_own(path: Path, mode: int) -> None:
    with contextlib.suppress(FileNotFoundError, PermissionError):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
            return  # a link is not followed out of the state dir; a job's foreign file is left alone
        if stat.S_IMODE(info.st_mode) & ~mode:
            os.chmod(path, stat.S_IMODE(info.st_mode) & mode)


def own_names(host: str) -> set[str]:
    """The Host names that are this server's own when it listens on ``host``: loopback names always,
    plus the machine's names and addresses when it listens beyond loopback."""
    names = {"localhost", "127.0.0.1", "::1", host.lower()}
    if host not in ("127.0.0.1", "localhost", "::1"):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        if host in ("0.0.0.0", "::", ""):  # every interface
            for addresses in psutil.net_if_addrs().values():
                names |= {a.address.split("%")[0].lower() for a in addresses
                          if a.family in (socket.AF_INET, socket.AF_INET6)}  # fmt: skip
    return names


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """Hold the state directory's lock; InvalidRequest if another server holds it."""
    secure_state_dir(state_dir)
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidRequest(
                f"another gpuslice server is using {state_dir}; stop it first or pass another --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound now: before the URL file is written or "listening" printed,
    so that of two servers started on one port the loser learns it first, says so in one line (exit 3)
    and announces nothing. SO_REUSEADDR as uvicorn sets it (a restart binds past TIME_WAIT); Linux still
    refuses a port that another socket listens on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise PortTaken(
                f"port {port} on {host} is held by another process (another gpuslice serve?); nothing was "
                "started or written: stop that one, or pick another --port"
            ) from None
        raise InvalidRequest(bind_refused(host, port, err)) from None
    return sock


def check_pids_max(mode: str, pids_max: int) -> None:
    """InvalidRequest when a --pids-max is asked of a containment mode that has no pids controller."""
    if pids_max and "pids" not in containment.limits_supported(mode):
        raise InvalidRequest(
            f"--pids-max needs a cgroup with the pids controller; containment {mode} has none"
        )


class _Stop(Exception):
    """SIGTERM before uvicorn serves: unwinds through the clean-up like SIGINT's KeyboardInterrupt."""


def _stop_on_sigterm(_signum: int, _frame: object) -> None:
    raise _Stop


def run(options: ServeOptions, on_ready: Callable[[str, Path, str], None] = lambda url, t, s: None) -> None:
    """Run the server until SIGINT/SIGTERM. Jobs keep running after it stops; the next start adopts them.

    ``on_ready(url, token_path, sign_in_url)`` is called once the state is recovered, just before
    serving; ``sign_in_url`` opens the dashboard once and leaves a read-only cookie."""
    state_dir = options.state_dir.expanduser().resolve()
    check_listen_host(options.host)  # before the state folder is locked or made
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        _run(options, state_dir, on_ready)
    except _Stop:
        _log.warning("stopped by SIGTERM")
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(options: ServeOptions, state_dir: Path, on_ready: Callable[[str, Path, str], None]) -> None:
    with state_lock(state_dir), contextlib.closing(listen(options.host, options.port)) as sock:
        try:
            mode = containment.detect(options.containment)
        except containment.ContainmentUnavailable as err:  # the mode asked for cannot work here: why
            raise InvalidRequest(f"--containment: {err}") from None
        check_pids_max(mode, options.pids_max)
        load_or_create_token(state_dir)
        token = TokenFile(state_dir)  # read again on SIGHUP and when the file changes
        write_url(state_dir, options.url)  # the port is ours: clients that find the state dir find us
        _log.info("containment: %s (%s)", mode, containment.describe(mode))
        contain = Containment(mode, options.grace_seconds, options.pids_max)
        node = LocalNode.open(state_dir, options.simulate, options.sharing, contain)
        store = Store(state_dir / STORE_FILE, busy_seconds=options.busy_seconds)
        telemetry = node.open_telemetry()
        daemon = Daemon(
            store,
            node.machine,
            node,
            state_dir,
            sharing=options.sharing,
            grace_seconds=options.grace_seconds,
            queue_policy=options.queue_policy,
            placement=options.placement,
            target=options.target,
            tick_seconds=options.tick_seconds,
            simulated=options.simulate is not None,
            telemetry=telemetry,
            guard=GuardConfig(memory_limit_bytes=options.policy_memory_bytes),
        )
        daemon.start()
        hangup = signal.getsignal(signal.SIGHUP)
        try:
            sign_in = new_sign_in_token()
            hosts = None if "*" in options.allow_hosts else own_names(options.host) | set(options.allow_hosts)
            app = create_app(daemon, lambda: token.current, public_reads=options.public_reads, hosts=hosts,
                             sign_in_token=sign_in)  # fmt: skip
            token.start()
            signal.signal(signal.SIGHUP, lambda _s, _f: token.reload())
            config = server_config(app, options.host, options.port)
            on_ready(options.url, state_dir / TOKEN_FILE, f"{options.url}/?token={sign_in}")
            # uvicorn handles SIGTERM itself (graceful HTTP shutdown) and then raises it again, which would
            # end the process before the clean-up below; once it has served, that echo is ignored.
            signal.signal(signal.SIGTERM, lambda _s, _f: None)
            _Server(config, app.state.stopping).run(sockets=[sock])
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up
            token.stop()
            signal.signal(signal.SIGHUP, hangup)
            daemon.stop()
            telemetry.close()
            running = True  # unless the store says otherwise: a locked or failing one keeps MPS up
            with contextlib.suppress(StoreUnavailable):
                running = store.count(JobState.RUNNING) > 0
            node.close(jobs_running=running)
            store.close()
