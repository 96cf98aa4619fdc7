"""Fixtures for the server tests: a fake node (no processes), a daemon over it, and an API client.

``FakeNode`` has the daemon's ``NodeOps`` methods and records every call; tests play the node's part
by setting ``exits`` (what ``poll`` reports), ``alive`` (PIDs that run), ``used`` (GPU memory per job)
and ``decisions`` (what the graded response answers).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import FakeNode, free_port, h100_machine

from gpuslice.node import launcher
from gpuslice.server.daemon import Daemon
from gpuslice.server.store import Store
from job_cleanup import end_job


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node() -> FakeNode:
    return FakeNode()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_daemon(tmp_path, node, clock):
    """make_daemon(**kw): a Daemon over a fresh (or the same) store in tmp_path, with the fake node."""
    opened: list[Store] = []

    def build(**kw: Any) -> Daemon:
        store = Store(tmp_path / "state.db")
        opened.append(store)
        kw.setdefault("grace_seconds", 2.0)
        kw.setdefault("monitor_seconds", 0.0)  # every tick: the fake clock does not move by itself
        return Daemon(store, kw.pop("machine", h100_machine()), node, tmp_path, clock=clock, **kw)

    yield build
    for store in opened:
        store.close()


@pytest.fixture
def daemon(make_daemon) -> Daemon:
    return make_daemon()


# -- a real server process, for the end-to-end and crash tests ---------------------------------------

BIN = Path(sys.executable).parent
FAKE_LOAD = str(BIN / "gpuslice-fake-load")


class ServerProcess:
    """``gpuslice serve --simulate …`` as a child process, with an httpx client for its API."""

    def __init__(self, state_dir: Path, *args: str) -> None:
        self.state_dir = state_dir
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=60)  # a loaded machine answers slowly

    def start(self) -> ServerProcess:
        where = ["--state-dir", str(self.state_dir), "--port", str(self.port)]
        command = [str(BIN / "gpuslice"), "serve", *where, *self.args]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir.parent / f"server-{self.port}.log", "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 90  # a loaded two-core machine takes a minute to import and start
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.state_dir.parent / f"server-{self.port}.log").read_text()
            with contextlib.suppress(httpx.TransportError):
                if self.http.get("/v1/health").status_code == 200:
                    self.token = (self.state_dir / "token").read_text().strip()
                    self.http.headers["Authorization"] = f"Bearer {self.token}"  # reads need it too
                    return self
            time.sleep(0.1)
        raise AssertionError("server did not come up in 90 s")

    @property
    def log(self) -> str:
        return (self.state_dir.parent / f"server-{self.port}.log").read_text()

    @property
    def sign_in_url(self) -> str:
        """The one-time dashboard link the server printed at its start."""
        (line,) = [line for line in self.log.splitlines() if line.startswith("dashboard: ")]
        return line.split()[1]

    def kill9(self) -> None:
        """SIGKILL the server: no shutdown code runs (its jobs keep running under their supervisors)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        self.http.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def submit(self, command: list[str], **body: Any) -> dict[str, Any]:
        r = self.http.post("/v1/jobs", json={"command": command, **body}, headers=self.auth)
        assert r.status_code == 201, r.text
        return r.json()

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {j["id"]: j for j in self.http.get("/v1/jobs", params={"limit": 10000}).json()}

    def wait(self, until: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}: {self.jobs()}")


def _kill_jobs(state_dir: Path) -> None:
    """SIGKILL the jobs the test's servers started: their containers, then their process groups (by their
    recorded pgid)."""
    db = state_dir / "gpuslice.db"
    if not db.exists():
        return
    store = Store(db)
    try:
        for job in store.jobs():
            if job.pgid and job.proc_start_time and launcher.is_alive(job.pgid, job.proc_start_time):
                end_job(job.pgid, state_dir)  # its container (a setsid child too), then the group
    finally:
        store.close()


@pytest.fixture
def serve(tmp_path):
    """serve(*args) -> a started ServerProcess on a simulated DGX H100; stopped, its jobs killed, after."""
    started: list[ServerProcess] = []

    def start(*args: str, state_dir: Path | None = None) -> ServerProcess:
        server = ServerProcess(state_dir or tmp_path / "state", "--simulate", "dgx-h100", *args)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
    for server in started:
        _kill_jobs(server.state_dir)
