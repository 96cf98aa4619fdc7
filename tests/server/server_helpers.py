"""Helpers the server tests share (a module, not conftest, so test files can import them by name)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.node import launcher
from gpuslice.node.launcher import ExitStatus, LaunchedJob
from gpuslice.server.store import Store, TenantRecord
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec
from job_cleanup import end_job

BIN = Path(sys.executable).parent  # the gpuslice command of the environment running the tests


def free_port() -> int:
    """A port nothing listens on (just released by the OS)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        self.launch_errors: dict[str, Exception] = {}  # raised once by the next launch of that job
        self.started: set[str] = set()  # jobs whose supervisor started (was_started)
        self.records: dict[str, dict[str, Any]] = {}  # job -> its last launch record (launch_records)
        self.ran: dict[float, float] = {}  # start_time -> seconds its process has run (running_seconds)
        self.stopped_supervisors: set[int] = set()  # supervisors SIGSTOPped (supervisor_stopped)
        self.containment = ""  # the mode launches report (LaunchedJob.containment)
        self._pid = 1000

    def launch(
        self,
        job_id: str,
        spec: JobSpec,
        env: Mapping[str, str],
        state_dir: Path,
        *,
        attempt: int = 0,
        about: Mapping[str, Any] | None = None,
    ) -> LaunchedJob:
        if job_id in self.launch_errors:
            raise self.launch_errors.pop(job_id)
        if job_id in self.fail_launch:
            raise OSError(f"cannot start {spec.command[0]}")
        self.exits.pop(job_id, None)
        self.started.add(job_id)
        self.records[job_id] = {"attempt": attempt, **(about or {})}
        self._pid += 1
        job = LaunchedJob(self._pid, self._pid, float(self._pid), self.containment)
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

    def launch_records(self, state_dir: Path) -> dict[str, dict[str, Any]]:
        return dict(self.records)

    def running_seconds(self, start_time: float) -> float | None:
        return self.ran.get(start_time)  # None: the daemon measures by its clock

    def was_started(self, job_id: str, state_dir: Path) -> bool:
        return job_id in self.started

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

    def supervisor_stopped(self, pid: int) -> bool:
        return pid in self.stopped_supervisors

    def check_host_limits(self, spec: JobSpec) -> None:
        return None

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


def h100_machine(n: int = 8) -> Machine:
    return Machine("test-h100", tuple(GpuInfo(i, f"GPU-{i}", "H100", 80 * GiB) for i in range(n)))


# -- a real server process, for the end-to-end and crash tests ---------------------------------------


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


def kill_jobs(state_dir: Path) -> None:
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
