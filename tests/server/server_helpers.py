"""Helpers the server tests share (a module, not conftest, so test files can import them by name)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.node.launcher import ExitStatus, LaunchedJob
from gpuslice.server.store import TenantRecord
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec


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
