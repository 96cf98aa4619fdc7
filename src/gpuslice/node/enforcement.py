"""How a job is held to its slice: the environment it starts with, and the MPS control daemon.

``job_env(mode, spec, gpus, machine, state_dir)`` → the variables ``launcher.launch`` adds:

```text
always
  CUDA_VISIBLE_DEVICES      GPU UUIDs (GPU-…) of ``gpus``, or the MIG device's UUID (MIG-…); "" hides
                            every GPU (CUDA Programming Guide, "CUDA Environment Variables")
  CUDA_DEVICE_ORDER         PCI_BUS_ID: ordinals inside the job match nvidia-smi (same guide)
  GPUSLICE_SHARING          the mode; GPUSLICE_GPUS / GPUSLICE_GPU_UUIDS: indices and UUIDs
  GPUSLICE_GPU_MEMORY_BYTES per-GPU memory of the slice (whole GPU's for whole GPUs, the instance's for MIG)
  GPUSLICE_COMPUTE_PERCENT  1..100 of each GPU's SMs (100 for whole GPUs and memory-only shares)
  GPUSLICE_MIG_PROFILE, GPUSLICE_TENANT, GPUSLICE_PRIORITY   from the spec
mps, for shares
  CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY   the daemon's directories (mps_dirs; NVIDIA MPS docs)
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE   integer percent, when compute < 100 (MPS docs)
  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT    "<GPU-uuid>=<MiB>M,…", when memory is given (MPS docs: "0=1G,1=512MB")
soft, for shares with memory
  PYTHONPATH, GPUSLICE_SOFT_CAP=1     the soft-cap sitecustomize dir (node/softcap.py); the launcher puts
                                      it in front of the job's own PYTHONPATH
shim, for shares (docs/shim.md)
  LD_PRELOAD                          the native shim (gpuslice.shim.library_path()), in front of the job's
  GPUSLICE_SHIM_DIR                   state_dir/shim: the job's region is <dir>/<GPUSLICE_JOB_ID>.region
  GPUSLICE_SHIM_GPU_REGION            <dir>/gpus.region, where priorities meet on each GPU
  LD_LIBRARY_PATH, FAKE_CUDA_*        simulated machines only: the fake driver, its devices, memory, UUIDs
every mode, for shares with memory
  TF_FORCE_GPU_ALLOW_GROWTH=true      TensorFlow grows instead of taking all memory (ray-project/ray#13680)
  XLA_PYTHON_CLIENT_MEM_FRACTION      JAX preallocates only the slice's fraction of the GPU
```

GPUSLICE_JOB_ID, GPUSLICE_JOB_DIR and GPUSLICE_REPORT_FILE are set by the launcher, which knows the job.
"""

from __future__ import annotations

import contextlib
import enum
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuslice import shim
from gpuslice.errors import InternalError, InvalidRequest, Unavailable
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import mig_gpu
from gpuslice.node import private_files, softcap
from gpuslice.units import MiB
from gpuslice.workload.job import DEFAULT_TENANT, JobSpec, is_a_share

__all__ = [
    "DEFAULT_SHARING",
    "MPS_CONTROL",
    "MpsDaemon",
    "MpsUnavailable",
    "SharingMode",
    "SliceLimits",
    "job_env",
    "mig_device_uuid",
    "mps_dirs",
    "mps_memory_limit",
    "sharing_mode",
    "shim_dir",
    "softcap_dir",
]

MPS_CONTROL = "nvidia-cuda-mps-control"
# MPS talks over Unix sockets in the pipe directory; a socket path longer than sun_path (108 bytes on
# Linux, less the socket's own name) fails at connect time with an unhelpful error. Deep state dirs get a
# short folder of random name instead (mps_dirs), recorded in the state dir under this name.
_MAX_PIPE_DIR_CHARS = 80
_MPS_RECORD = "mps-dir"


class SharingMode(enum.StrEnum):
    """How a machine's GPUs are shared (``gpuslice serve --sharing``)."""

    MPS = "mps"  # one MPS control daemon; per-job thread % and pinned memory limit
    MIG = "mig"  # each job gets a MIG instance
    SOFT = "soft"  # default: PyTorch memory fraction + the monitor's graded response
    SHIM = "shim"  # the native shim preloaded into every process: memory fence, compute share, priorities


# `serve --sharing` and the device plugin's --sharing when none is named: needs nothing on the machine.
DEFAULT_SHARING = SharingMode.SOFT


def sharing_mode(text: str, what: str = "sharing mode") -> SharingMode:
    """The SharingMode ``text`` names; InvalidRequest naming ``what`` and the known modes otherwise."""
    try:
        return SharingMode(text)
    except ValueError:
        known = ", ".join(m.value for m in SharingMode)
        raise InvalidRequest(f"{what} {text!r} is not known; known: {known}") from None


class MpsUnavailable(Unavailable):
    """The MPS control program is missing or will not start."""


def mps_dirs(state_dir: Path) -> tuple[Path, Path]:
    """(pipe dir, log dir) of the MPS control daemon for ``state_dir``; the server and every job agree.

    Normally under state_dir/mps. A state dir too deep for a socket path gets a folder that mkdtemp
    makes (a random name, 0700: no other user can have made it first, as with a name derived from the
    state dir) under $XDG_RUNTIME_DIR, else the temp dir; its name is recorded in state_dir/mps-dir,
    so a restarted server finds the daemon its jobs still use. ``MpsDaemon.start`` checks the folders."""
    state_dir = Path(state_dir).resolve()
    base = state_dir / "mps"
    if len(str(base / "pipe")) > _MAX_PIPE_DIR_CHARS:
        base = _recorded_mps_base(state_dir) or _new_mps_base(state_dir)
    return base / "pipe", base / "log"


def _recorded_mps_base(state_dir: Path) -> Path | None:
    """The short MPS folder recorded for ``state_dir``, if it is still there, ours and private."""
    with contextlib.suppress(OSError, ValueError, private_files.UnsafeFile):
        file = private_files.open_for_reading(state_dir / _MPS_RECORD)
        if file is None:
            return None
        with file:
            base = Path(file.read(4096).decode("utf-8").strip())
        if base.is_absolute() and len(str(base / "pipe")) <= _MAX_PIPE_DIR_CHARS:
            os.close(private_files.open_folder(base))
            return base
    return None  # gone (a reboot emptied /tmp), damaged, or not private: a new one is made


def _new_mps_base(state_dir: Path) -> Path:
    runtime: str | None = os.environ.get("XDG_RUNTIME_DIR") or None
    if runtime is not None:
        try:  # the user's own runtime folder (freedesktop base-directory spec: 0700, theirs alone)
            os.close(private_files.open_folder(runtime))
        except (OSError, private_files.UnsafeFile):
            runtime = None
    if runtime is not None and len(runtime) > _MAX_PIPE_DIR_CHARS // 2:
        runtime = None
    base = Path(tempfile.mkdtemp(prefix="gpuslice-mps-", dir=runtime))
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = state_dir / f".{_MPS_RECORD}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as f:
        f.write(str(base))
    os.replace(tmp, state_dir / _MPS_RECORD)
    return base


def softcap_dir(state_dir: Path) -> Path:
    """state_dir/softcap holding ``sitecustomize.py`` (a copy of node/softcap.py), written if stale."""
    directory = Path(state_dir).resolve() / "softcap"
    target = directory / "sitecustomize.py"
    source = Path(softcap.__file__).read_text(encoding="utf-8")
    if not target.exists() or target.read_text(encoding="utf-8") != source:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # the state dir's files are its user's
        tmp = directory / f".sitecustomize.{os.getpid()}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            f.write(source)
        os.replace(tmp, target)
    return directory


def shim_dir(state_dir: Path) -> Path:
    """state_dir/shim: the jobs' shim regions and the node's GPU region (created if missing)."""
    directory = Path(state_dir).resolve() / "shim"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return directory


def mps_memory_limit(uuids: Sequence[str], limit_bytes: int) -> str:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for ``limit_bytes`` on each device (NVIDIA MPS documentation).

    Format: comma-separated ``<device>=<limit>`` with a unit suffix, e.g. ``0=1G,1=512MB``. We name
    devices by UUID (accepted, "same semantics as CUDA_VISIBLE_DEVICES"), which stays right whatever
    ordinal the job sees, and give whole MiB rounded down, so the cap never exceeds the slice."""
    mib = max(1, limit_bytes // MiB)
    return ",".join(f"{uuid}={mib}M" for uuid in uuids)


def mig_device_uuid(machine: Machine, gpu: int, profile: str, start: int, nvml: Any | None = None) -> str:
    """The UUID (``MIG-…``) of the MIG instance ``profile`` at memory slot ``start`` on GPU ``gpu``.

    On a simulated machine the UUID is made up deterministically; on a real one it is looked up
    through NVML (the instance must exist: under ``--sharing mig`` the server's ``MigManager`` creates
    it first; this function never creates one)."""
    from gpuslice.node.discovery import SIMULATED_UUID_PREFIX, find_mig_device_uuid

    info = machine.gpus[gpu]
    if info.uuid.startswith(SIMULATED_UUID_PREFIX):
        return f"MIG-{info.uuid.removeprefix('GPU-')}-{profile}-{start}"
    return find_mig_device_uuid(gpu, profile, start, nvml=nvml)


@dataclass(frozen=True, slots=True)
class SliceLimits:
    """What enforcement holds one slice to, whichever home asked (a serve job, a pod's container): memory
    on each GPU (0: all of it), the percent of each GPU's compute (0 or 100: no cap) or a MIG profile,
    whether the GPUs are its alone, and who it is for (the shim and the metrics read the tenant and the
    priority's name)."""

    gpu_memory_bytes: int = 0
    compute_percent: int = 0
    mig_profile: str = ""
    exclusive: bool = False
    tenant: str = DEFAULT_TENANT
    priority: str = "normal"

    @property
    def is_share(self) -> bool:
        """A share of one GPU rather than whole GPUs (``workload.job.is_a_share``)."""
        return is_a_share(self.exclusive, self.mig_profile, self.gpu_memory_bytes, self.compute_percent)

    @classmethod
    def of_job(cls, spec: JobSpec) -> SliceLimits:
        return cls(spec.gpu_memory_bytes, spec.compute_percent, spec.mig_profile, spec.exclusive,
                   spec.tenant, spec.priority.name.lower())  # fmt: skip


def job_env(
    mode: SharingMode | str,
    spec: JobSpec | SliceLimits,
    gpus: Sequence[int],
    machine: Machine,
    state_dir: Path,
    *,
    mig: Any | None = None,
    nvml: Any | None = None,
) -> dict[str, str]:
    """The environment variables that confine a job to its slice (table in the module docstring).

    ``mig`` is the scheduler's ``MigAssignment`` (gpu, profile, start) for a MIG job; ``nvml`` a
    pynvml-like module for tests. Pure apart from (re)writing the soft-cap file and reading NVML for
    a real MIG instance's UUID. ``spec``: a serve job's, or a pod container's ``SliceLimits``."""
    if isinstance(spec, JobSpec):
        spec = SliceLimits.of_job(spec)
    mode = sharing_mode(mode)
    for g in gpus:
        if not 0 <= g < machine.gpu_count:
            raise InternalError(f"GPU {g} is not on machine {machine.name!r} ({machine.gpu_count} GPUs)")
    infos = [machine.gpus[g] for g in gpus]
    uuids = [info.uuid for info in infos]
    memory_bytes = min((info.memory_bytes for info in infos), default=0)
    compute_percent = 100
    if mig is not None:
        profile = mig_gpu(machine.gpus[mig.gpu].mig_model).profile(mig.profile)
        visible = [mig_device_uuid(machine, mig.gpu, profile.name, mig.start, nvml)]
        memory_bytes = profile.memory_bytes
        gpus, uuids = (mig.gpu,), [machine.gpus[mig.gpu].uuid]
    elif spec.mig_profile:
        raise InternalError(f"job asks for MIG profile {spec.mig_profile!r} but was given no MIG instance")
    else:
        visible = uuids
        if spec.is_share:
            memory_bytes = spec.gpu_memory_bytes or memory_bytes
            compute_percent = spec.compute_percent or 100
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(visible),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUSLICE_SHARING": mode.value,
        "GPUSLICE_GPUS": ",".join(str(g) for g in gpus),
        "GPUSLICE_GPU_UUIDS": ",".join(uuids),
        "GPUSLICE_GPU_MEMORY_BYTES": str(memory_bytes),
        "GPUSLICE_COMPUTE_PERCENT": str(compute_percent),
        "GPUSLICE_MIG_PROFILE": spec.mig_profile,
        "GPUSLICE_TENANT": spec.tenant,
        "GPUSLICE_PRIORITY": spec.priority,
    }
    memory_share = spec.is_share and spec.gpu_memory_bytes > 0
    if memory_share:
        fraction = min(1.0, spec.gpu_memory_bytes / min(info.memory_bytes for info in infos))
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.4f}"
    if mode is SharingMode.MPS and spec.is_share:
        pipe, log = mps_dirs(state_dir)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(log)
        if 0 < spec.compute_percent < 100:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(spec.compute_percent)
        if memory_share:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = mps_memory_limit(uuids, spec.gpu_memory_bytes)
    if mode is SharingMode.SOFT and memory_share:
        env["PYTHONPATH"] = str(softcap_dir(state_dir))
        env[softcap.ENV_SOFT_CAP] = "1"
    if mode is SharingMode.SHIM and spec.is_share:
        from gpuslice.node.discovery import SIMULATED_UUID_PREFIX

        simulated = all(info.uuid.startswith(SIMULATED_UUID_PREFIX) for info in infos)
        env.update(shim.environment(shim_dir(state_dir), simulated=simulated))
        if simulated:
            env["FAKE_CUDA_DEVICES"] = str(len(infos))
            env["FAKE_CUDA_MEMORY_BYTES"] = str(min(info.memory_bytes for info in infos))
            env["FAKE_CUDA_UUIDS"] = ",".join(uuids)  # fake NVML names the job's GPUs as the job does
    return env


class MpsDaemon:
    """The MPS control daemon (``nvidia-cuda-mps-control -d``) that the server starts and owns.

    Pipe and log directories come from ``mps_dirs(state_dir)``; jobs get the same ones from ``job_env``.
    Per-client limits come from each job's environment (MPS docs: they can only tighten the daemon's
    defaults, which we leave unset). Usable as a context manager."""

    def __init__(self, state_dir: Path, *, binary: str = MPS_CONTROL, timeout_seconds: float = 10.0) -> None:
        self.pipe_dir, self.log_dir = mps_dirs(state_dir)
        self.binary = binary
        self.timeout_seconds = timeout_seconds

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def _program(self) -> str:
        path = shutil.which(self.binary)
        if path is None:
            raise MpsUnavailable(
                f"{self.binary} not found on PATH: install the NVIDIA driver's utilities (it ships with "
                "them), or run gpuslice serve --sharing soft"
            )
        return path

    def _command(self, text: str) -> subprocess.CompletedProcess[str]:
        """Send one command (``get_server_list``, ``quit`` …) to the running daemon on its stdin."""
        return subprocess.run(
            [self._program()],
            input=text + "\n",
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=self.timeout_seconds,
            check=False,
        )

    def is_running(self) -> bool:
        """True when a control daemon answers on our pipe directory."""
        if not (self.pipe_dir / "control").exists():
            return False
        try:
            return self._command("get_server_list").returncode == 0
        except (subprocess.TimeoutExpired, OSError):
            return False

    def start(self) -> None:
        """Start the daemon (nothing to do if it already runs); MpsUnavailable says why it cannot."""
        program = self._program()
        for folder in (self.pipe_dir.parent, self.pipe_dir, self.log_dir):
            # Before asking a daemon there: whoever can write the pipe folder can pose as our daemon.
            try:
                private_files.private_folder(folder)
            except private_files.UnsafeFile as err:
                raise MpsUnavailable(
                    f"the MPS folder is not private: {err}. Remove it (or make it your own, mode 0700) "
                    "and start again"
                ) from None
        if self.is_running():
            return
        done = subprocess.run(
            [program, "-d"],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=self.timeout_seconds,
            check=False,
        )
        deadline = time.monotonic() + self.timeout_seconds
        while done.returncode == 0 and time.monotonic() < deadline:
            if self.is_running():
                return
            time.sleep(0.1)
        log = self.log_dir / "control.log"
        tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
        raise MpsUnavailable(
            f"{self.binary} -d did not start (exit {done.returncode}: {done.stderr.strip() or 'no output'}); "
            f"its log {log}: {tail.strip() or 'empty'}"
        )

    def stop(self) -> None:
        """Ask the daemon to quit (it stops its servers after their clients end); no-op if not running."""
        if not self.is_running():
            return
        self._command("quit")
        deadline = time.monotonic() + self.timeout_seconds
        while time.monotonic() < deadline and self.is_running():
            time.sleep(0.1)

    def __enter__(self) -> MpsDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
