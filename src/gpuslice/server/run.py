"""Wire a server together and run it: state dir, lock, token, machine, store, daemon, API, uvicorn.

``gpuslice serve`` (cli/serve.py) calls ``run``; tests and the benchmark start the same thing as a
subprocess. One server per state directory: a second one is refused while the first holds the lock
(the lock is an flock, so a server killed with ``kill -9`` leaves nothing to clean up).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from gpuslice.errors import InvalidRequest
from gpuslice.server.app import create_app
from gpuslice.server.auth import TOKEN_FILE, load_or_create_token
from gpuslice.server.daemon import DEFAULT_GRACE_SECONDS, Daemon
from gpuslice.server.local_node import LocalNode
from gpuslice.server.store import Store
from gpuslice.server.url_file import write_url
from gpuslice.workload.job import JobState

__all__ = ["ServeOptions", "run", "state_lock"]

_log = logging.getLogger("gpuslice.server")
STORE_FILE = "gpuslice.db"
LOCK_FILE = "server.lock"


@dataclass(frozen=True)
class ServeOptions:
    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 8787
    simulate: str | None = None
    sharing: str = "soft"
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    tick_seconds: float = 0.2
    queue_policy: str = "priority-fair"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """Hold the state directory's lock; InvalidRequest if another server holds it."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
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


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            raise InvalidRequest(
                f"cannot listen on {host}:{port} ({err.strerror}); is a server already running there? "
                "pick another --port"
            ) from None


def run(options: ServeOptions, on_ready: Callable[[str, Path], None] = lambda url, token: None) -> None:
    """Run the server until SIGINT/SIGTERM. Jobs keep running after it stops; the next start adopts them.

    ``on_ready(url, token_path)`` is called once the state is recovered, just before serving."""
    state_dir = options.state_dir.expanduser().resolve()
    with state_lock(state_dir):
        _check_port(options.host, options.port)
        token = load_or_create_token(state_dir)
        write_url(state_dir, options.url)  # clients that find the state dir find the server too
        node = LocalNode.open(state_dir, options.simulate, options.sharing)
        store = Store(state_dir / STORE_FILE)
        telemetry = node.open_telemetry()
        daemon = Daemon(
            store,
            node.machine,
            node,
            state_dir,
            sharing=options.sharing,
            grace_seconds=options.grace_seconds,
            queue_policy=options.queue_policy,
            tick_seconds=options.tick_seconds,
            simulated=options.simulate is not None,
            telemetry=telemetry,
        )
        daemon.start()
        try:
            on_ready(options.url, state_dir / TOKEN_FILE)
            app = create_app(daemon, token)
            config = uvicorn.Config(app, host=options.host, port=options.port, log_level="warning",
                                    access_log=False)  # fmt: skip
            uvicorn.Server(config).run()
        finally:
            daemon.stop()
            telemetry.close()
            node.close(jobs_running=store.count(JobState.RUNNING) > 0)
            store.close()
