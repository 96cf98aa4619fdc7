"""``LocalNode``: the daemon's ``NodeOps`` on this machine, made of ``gpuslice.node``'s pieces.

launch/poll/signals come from ``node.launcher``, the job environment from ``node.enforcement``, GPU
memory per job from ``node.monitor`` (NVML, or the fake-load reports on a ``--simulate`` machine), and
the graded response (warn → suspend → kill) from ``monitor.GradedResponse``, one per tenant setting.
With ``--sharing mig`` on a real machine, ``node.mig_manager`` creates a job's MIG instance before its
environment is built (``job_env``), ties it to the job at ``launch``, and destroys it at ``forget``
(the daemon calls it whenever a job ends). Every job runs in a container (``node.containment``: its
cgroup, or its supervisor's descendants) of the mode the server resolved at its start; signals and kills
reach the whole container, found from the job's records, so they work after a restart. With
``--sharing shim`` jobs run under the native shim
(``gpuslice.shim``), and their memory is read from the shim's regions. ``open_telemetry`` gives the
daemon its GPU readings: the simulated model on a ``--simulate`` machine, NVML otherwise, with
``node.gpu_faults``'s NVML XID source for faults (the same source the device plugin uses; it imports nothing
of Kubernetes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from gpuslice import shim
from gpuslice.errors import InvalidRequest
from gpuslice.hardware.machine import Machine
from gpuslice.node import containment, enforcement, launcher, monitor
from gpuslice.node.discovery import discover, is_simulated
from gpuslice.node.gpu_faults import NvmlHealthSource
from gpuslice.node.launcher import ExitStatus, LaunchedJob
from gpuslice.node.mig_manager import MigManager
from gpuslice.node.telemetry import NvmlTelemetry, SimulatedTelemetry, Telemetry
from gpuslice.scheduler.node_decisions import MigAssignment
from gpuslice.server.store import TenantRecord
from gpuslice.workload.job import JobSpec

__all__ = ["LocalNode"]

_log = logging.getLogger("gpuslice.server")


class LocalNode:
    """This machine's GPUs and processes, for one state directory and one sharing mode."""

    def __init__(self, machine: Machine, state_dir: Path, sharing: str,
                 mps: enforcement.MpsDaemon | None = None, *, mig: MigManager | None = None,
                 nvml: Any | None = None, contain: launcher.Containment | None = None) -> None:  # fmt: skip
        self.machine = machine
        self.state_dir = Path(state_dir)
        self.sharing = enforcement.SharingMode(sharing)
        self._mps = mps
        self._mig = mig  # None: MIG instances must exist already (simulated machine, or not --sharing mig)
        self._nvml = nvml  # a pynvml-like module for tests; None: the real one
        self._responses: dict[str, monitor.GradedResponse] = {}
        self.contain = contain or launcher.Containment()

    @classmethod
    def open(cls, state_dir: Path, simulate: str | None, sharing: str,
             contain: launcher.Containment | None = None) -> LocalNode:  # fmt: skip
        """Discover the machine (or simulate it) and start what the sharing mode needs (the MPS daemon).

        On a simulated machine there is no MPS to start: jobs get the MPS variables all the same.
        ``contain`` (its mode already resolved by ``containment.detect``) is how jobs are kept together."""
        mode = enforcement.sharing_mode(sharing, "--sharing")
        machine = discover(simulate, instance=str(Path(state_dir).resolve()))
        mps = None
        if mode is enforcement.SharingMode.MPS and simulate is None:
            mps = enforcement.MpsDaemon(state_dir)
            mps.start()
        if mode is enforcement.SharingMode.SHIM:  # ShimUnavailable (the library was not built) says so now
            shim.library_path()
            if is_simulated(machine):
                shim.fake_driver_dir()
        mig = None
        if mode is enforcement.SharingMode.MIG and not is_simulated(machine):
            mig = MigManager(machine, state_dir)
            mig.destroy_idle()  # leftovers of a crash between create and launch
        return cls(machine, state_dir, mode.value, mps, mig=mig, contain=contain)

    def open_telemetry(self) -> Telemetry:
        """GPU readings for the daemon; the caller closes it."""
        if is_simulated(self.machine):
            return SimulatedTelemetry(self.machine)
        try:
            faults = NvmlHealthSource(self.machine, nvml=self._nvml)
        except Exception as err:  # no event sets (some virtualised GPUs): ECC counts still mark faults
            _log.warning("XID events cannot be watched (%s); GPU faults come from ECC counts only", err)
            faults = None
        return NvmlTelemetry(self.machine, faults, nvml=self._nvml)

    def close(self, jobs_running: bool) -> None:
        """Stop the MPS daemon unless jobs still use it (they outlive the server; the next one adopts),
        and destroy the MIG instances gpuslice created that no job uses."""
        if self._mps is not None and not jobs_running:
            self._mps.stop()
        if self._mig is not None:
            self._mig.destroy_idle()

    # -- processes ------------------------------------------------------------------------------------

    def launch(
        self,
        job_id: str,
        spec: JobSpec,
        env: Mapping[str, str],
        state_dir: Path,
        *,
        attempt: int,
        about: Mapping[str, Any] | None = None,
    ) -> LaunchedJob:
        visible = env.get("CUDA_VISIBLE_DEVICES", "")
        if self._mig is not None and visible.startswith("MIG-"):
            self._mig.claim(job_id, visible)  # before the process: a failed launch still releases it
        return launcher.launch(
            job_id, spec, env, state_dir, attempt=attempt, about=about, contain=self.contain
        )

    def check_host_limits(self, spec: JobSpec) -> None:
        """InvalidRequest naming the field when the containment mode cannot enforce a host limit asked."""
        limits = (("memory", "host_memory_bytes", spec.host_memory_bytes), ("cpus", "cpus", spec.cpus))
        asked = [(name, field) for name, field, value in limits if value]
        supported = containment.limits_supported(self.contain.mode) if asked else frozenset()
        for name, field in asked:
            if name not in supported:
                raise InvalidRequest(
                    f"{field}: this server keeps jobs together by {self.contain.mode}, which cannot enforce "
                    f"a {name} limit here; start it with a cgroup mode (gpuslice serve --help) or drop it"
                )

    def supervisor_stopped(self, pid: int) -> bool:
        return launcher.is_stopped(pid)

    def launch_records(self, state_dir: Path) -> dict[str, dict[str, Any]]:
        return launcher.launch_records(state_dir)

    def poll(self, job_id: str, state_dir: Path) -> ExitStatus | None:
        return launcher.poll(job_id, state_dir)

    def running_seconds(self, start_time: float) -> float | None:
        return launcher.seconds_since(start_time)

    def was_started(self, job_id: str, state_dir: Path) -> bool:
        return launcher.was_started(job_id, state_dir)

    def is_alive(self, pid: int, start_time: float) -> bool:
        return launcher.is_alive(pid, start_time)

    def find_supervisor(self, job_id: str, state_dir: Path) -> LaunchedJob | None:
        """The supervisor running with ``--job-dir state_dir/jobs/<id>``, if any (crash mid-launch)."""
        wanted = str(launcher.job_dir(state_dir, job_id))
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmdline = p.info.get("cmdline") or []
            if "--job-dir" in cmdline and wanted in cmdline and p.info["pid"] != os.getpid():
                started = launcher.process_start(p.info["pid"])
                with contextlib.suppress(OSError):
                    if started is not None:
                        pgid = os.getpgid(p.info["pid"])
                        return LaunchedJob(pid=p.info["pid"], pgid=pgid, start_time=started)
        return None

    def terminate(self, pgid: int, grace_seconds: float) -> bool:
        return launcher.terminate(pgid, grace_seconds, self.state_dir)

    def suspend(self, pgid: int) -> bool:
        return launcher.suspend(pgid, self.state_dir)

    def resume(self, pgid: int) -> bool:
        return launcher.resume(pgid, self.state_dir)

    def kill(self, pgid: int) -> bool:
        return launcher.kill(pgid, self.state_dir)

    # -- enforcement ----------------------------------------------------------------------------------

    def job_env(self, spec: JobSpec, gpus: tuple[int, ...], mig: MigAssignment | None) -> dict[str, str]:
        """The job's environment; under ``--sharing mig`` its MIG instance is created first if missing
        (MigCommandFailed / MigPermissionDenied say why it could not be)."""
        if self._mig is None or mig is None:
            return enforcement.job_env(
                self.sharing, spec, gpus, self.machine, self.state_dir, mig=mig, nvml=self._nvml
            )
        self._mig.acquire(mig.gpu, mig.profile, mig.start)
        try:
            return enforcement.job_env(
                self.sharing, spec, gpus, self.machine, self.state_dir, mig=mig, nvml=self._nvml
            )
        except Exception:
            self._mig.destroy_idle()  # the instance just created, claimed by no job
            raise

    def usage(self, jobs: Mapping[str, int]) -> tuple[dict[str, dict[int, int]], dict[int, int]]:
        shim_dir = None
        if self.sharing is enforcement.SharingMode.SHIM:
            shim_dir = enforcement.shim_dir(self.state_dir)
        return monitor.usage(self.machine, jobs, nvml=self._nvml, shim_dir=shim_dir)

    def response_defaults(self) -> dict[str, Any]:
        return dataclasses.asdict(monitor.ResponseConfig())

    def check_response(self, settings: Mapping[str, Any]) -> None:
        """InvalidRequest naming the setting when ``settings`` is not a valid graded-response config."""
        known = {f.name for f in dataclasses.fields(monitor.ResponseConfig)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise InvalidRequest(
                f"response: unknown setting {unknown[0]!r}; known: {', '.join(sorted(known))}"
            )
        try:
            monitor.ResponseConfig(**settings)
        except TypeError as err:
            raise InvalidRequest(f"response: {err}") from None

    def forget(self, job_id: str) -> None:
        """A job ended or was requeued: its next over-limit episode starts afresh, and a MIG instance
        gpuslice created for it is destroyed when no other job uses it."""
        for response in self._responses.values():
            response.forget(job_id)
        if self.sharing is enforcement.SharingMode.SHIM:  # a requeued run starts with an empty budget
            shim.region_path(enforcement.shim_dir(self.state_dir), job_id).unlink(missing_ok=True)
        if self._mig is not None:
            self._mig.release(job_id)

    def respond(
        self, job_id: str, tenant: TenantRecord | None, used: int, limit: int, now: float
    ) -> tuple[str, str] | None:
        settings = dict(tenant.response) if tenant else {}
        key = repr(sorted(settings.items()))
        response = self._responses.get(key)
        if response is None:
            response = self._responses[key] = monitor.GradedResponse(monitor.ResponseConfig(**settings))
        action = response.decide(job_id, used, limit, now)
        return None if action is None else (action.kind, action.reason)
