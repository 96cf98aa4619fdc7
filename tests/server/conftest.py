"""Fixtures for the server tests: a fake node (no processes), a daemon over it, and an API client.

``FakeNode`` has the daemon's ``NodeOps`` methods and records every call; tests play the node's part
by setting ``exits`` (what ``poll`` reports), ``alive`` (PIDs that run), ``used`` (GPU memory per job)
and ``decisions`` (what the graded response answers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from server_helpers import free_port

from gpuslice.node.launcher import ExitStatus, LaunchedJob
from gpuslice.node.machine import GpuInfo, Machine
from gpuslice.server.daemon import Daemon
from gpuslice.server.store import Store, TenantRecord
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec


class FakeNode:
    def __init__(self) -> None:
        self.launched: dict[str, LaunchedJob] = {}
        self.envs: dict[str, dict[str, str]] = {}
        self.exits: dict[str, ExitStatus] = {}
        self.alive: set[int] = set()
        self.found: dict[str, LaunchedJob] = {}
        self.signals: list[tuple[str, int]] = []
        self.used: dict[str, dict[int, int]] = {}
        self.external: dict[int, int] = {}
        self.decisions: dict[str, tuple[str, str]] = {}
        self.fail_launch: set[str] = set()
        self._pid = 1000

    def launch(self, job_id: str, spec: JobSpec, env: Mapping[str, str], state_dir: Path) -> LaunchedJob:
        if job_id in self.fail_launch:
            raise OSError(f"cannot start {spec.command[0]}")
        self.exits.pop(job_id, None)
        self._pid += 1
        job = LaunchedJob(self._pid, self._pid, float(self._pid))
        self.launched[job_id] = job
        self.envs[job_id] = dict(env)
        self.alive.add(job.pid)
        return job

    def exit(self, job_id: str, code: int = 0, signal: int | None = None) -> None:
        """The job's command ends: its exit file appears and its supervisor goes away."""
        self.exits[job_id] = ExitStatus(code, signal, 0.0)
        self.alive.discard(self.launched[job_id].pid)

    def poll(self, job_id: str, state_dir: Path) -> ExitStatus | None:
        return self.exits.get(job_id)

    def is_alive(self, pid: int, start_time: float) -> bool:
        return pid in self.alive

    def find_supervisor(self, job_id: str, state_dir: Path) -> LaunchedJob | None:
        return self.found.get(job_id)

    def terminate(self, pgid: int, grace_seconds: float) -> bool:
        self.signals.append(("term", pgid))
        return True

    def suspend(self, pgid: int) -> bool:
        self.signals.append(("stop", pgid))
        return True

    def resume(self, pgid: int) -> bool:
        self.signals.append(("cont", pgid))
        return True

    def kill(self, pgid: int) -> bool:
        self.signals.append(("kill", pgid))
        return True

    def job_env(self, spec: JobSpec, gpus: tuple[int, ...], mig: Any) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(f"GPU-{g}" for g in gpus)}

    def usage(self, jobs: Mapping[str, int]) -> tuple[dict[str, dict[int, int]], dict[int, int]]:
        return {j: dict(self.used.get(j, {})) for j in jobs}, dict(self.external)

    def respond(
        self, job_id: str, tenant: TenantRecord | None, used: int, limit: int, now: float
    ) -> tuple[str, str] | None:
        return self.decisions.pop(job_id, None)

    def check_response(self, settings: Mapping[str, Any]) -> None:
        return None

    def response_defaults(self) -> dict[str, Any]:
        return {"kill_after_seconds": 120.0}

    def forget(self, job_id: str) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def h100_machine(n: int = 8) -> Machine:
    return Machine("test-h100", tuple(GpuInfo(i, f"GPU-{i}", "H100", 80 * GiB) for i in range(n)))


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
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def start(self) -> ServerProcess:
        where = ["--state-dir", str(self.state_dir), "--port", str(self.port)]
        command = [str(BIN / "gpuslice"), "serve", *where, *self.args]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir.parent / f"server-{self.port}.log", "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.state_dir.parent / f"server-{self.port}.log").read_text()
            with contextlib.suppress(httpx.TransportError):
                if self.http.get("/v1/health").status_code == 200:
                    self.token = (self.state_dir / "token").read_text().strip()
                    self.http.headers["Authorization"] = f"Bearer {self.token}"  # reads need it too
                    return self
            time.sleep(0.1)
        raise AssertionError("server did not come up in 20 s")

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
    """SIGKILL the process groups of jobs the test's servers started (by their recorded pgid)."""
    db = state_dir / "gpuslice.db"
    if not db.exists():
        return
    store = Store(db)
    try:
        for job in store.jobs():
            if job.pgid and job.proc_start_time and psutil.pid_exists(job.pgid):
                with contextlib.suppress(psutil.Error):
                    if abs(psutil.Process(job.pgid).create_time() - job.proc_start_time) < 0.05:
                        os.killpg(job.pgid, signal.SIGKILL)
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
