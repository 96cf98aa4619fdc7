"""Find this machine's GPUs: through NVML (nvidia-ml-py), or a built-in profile with ``--simulate``.

```text
discover(None)        → NVML: index, UUID, model (catalogue name when it matches), memory, MIG mode and
                        table, topology (hardware/topology_nvml.py), host CPU and memory
discover("dgx-h100")  → the built-in profile (hardware/topology_profiles.py) with its GPU model and
                        deterministic fake UUIDs "GPU-sim-<8 hex>-<index>"; ":mig" turns MIG mode on
                        for MIG-capable models, "@MODEL" picks the model ("pcie-8gpu-2socket@L4:mig")
neither works         → NoGpuDriver, which says to try --simulate
```

``pynvml`` is imported only for a real read; tests pass a fake module as ``nvml``. Processes on the
GPUs (``gpu_processes``), MIG device UUIDs (``find_mig_device_uuid``), and telemetry and faults
(``gpu_telemetry``: utilisation, memory, temperature, power, uncorrected ECC errors) are read here too,
so every NVML call of the node layer is in this file (XID events: ``node/gpu_faults.py``'s NVML source,
shared by the device plugin and serve).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

from gpuslice.errors import Unavailable, UserError
from gpuslice.hardware.gpu_models import GPU_MODELS
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.mig import MigGpu, UnknownMigGpu, mig_gpu
from gpuslice.hardware.mig_nvml import detect_gpu
from gpuslice.hardware.topology import Topology, TopologyError
from gpuslice.hardware.topology_nvml import read_nvml_topology
from gpuslice.hardware.topology_profiles import PROFILES, profile

__all__ = [
    "DEFAULT_SIMULATED_MODEL",
    "SIMULATED_UUID_PREFIX",
    "MigInstanceMissing",
    "NoGpuDriver",
    "NvmlReading",
    "catalogue_model",
    "discover",
    "find_mig_device_uuid",
    "gpu_processes",
    "gpu_telemetry",
    "is_simulated",
    "load_nvml",
]

log = logging.getLogger(__name__)

SIMULATED_UUID_PREFIX = "GPU-sim-"
# Profiles without a GPU model (pcie-8gpu-2socket) get this one: a PCIe-only card in the catalogue.
# An assumption for demos; "@MODEL" overrides it.
DEFAULT_SIMULATED_MODEL = "A10"
# A catalogue name is used only when NVML's total memory is within this fraction of the catalogue's:
# "H100 NVL" (94 GB) must not become "H100" (80 GB).
_MEMORY_MATCH_TOLERANCE = 0.10
# NVML product names → catalogue names, tried in order (A100 before A10, which it contains).
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bH200\b", "H200"),
    (r"\bH100\b", "H100"),
    (r"\bA100\b.*\b40\s?GB\b", "A100-40GB"),
    (r"\bA100\b", "A100-80GB"),
    (r"\bA10\b", "A10"),
    (r"\bL4\b", "L4"),
    (r"\bT4\b", "T4"),
    (r"\bV100\b.*\b32\s?GB\b", "V100M32"),
    (r"\bV100\b", "V100M16"),
    (r"\bP100\b", "P100"),
)
_HINT = "use --simulate dgx-h100 to try gpuslice without GPUs (other profiles: " + ", ".join(PROFILES) + ")"


class NoGpuDriver(Unavailable):
    """No NVML here (nvidia-ml-py missing, no NVIDIA driver, or no GPUs) and no --simulate given."""


class MigInstanceMissing(UserError):
    """A MIG instance the scheduler assigned does not exist on the GPU."""


def load_nvml() -> ModuleType:
    """``pynvml``, initialised; NoGpuDriver says what is missing and suggests --simulate."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        raise NoGpuDriver(
            "no NVIDIA driver/NVML found (nvidia-ml-py is not installed: pip install 'gpuslice[nvml]'); "
            + _HINT
        ) from None
    try:
        nvml.nvmlInit()
    except Exception as e:  # pynvml raises NVMLError_LibraryNotFound / _DriverNotLoaded …
        raise NoGpuDriver(f"no NVIDIA driver/NVML found ({e}); {_HINT}") from None
    return nvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def catalogue_model(product_name: str, memory_bytes: int) -> str:
    """The catalogue name for an NVML product name ("NVIDIA H100 80GB HBM3" → "H100") when its memory
    agrees; otherwise the product name without the "NVIDIA "/"Tesla " prefix."""
    for pattern, name in _NAME_PATTERNS:
        if re.search(pattern, product_name, flags=re.IGNORECASE):
            expected = GPU_MODELS[name].memory_bytes
            if abs(memory_bytes - expected) <= _MEMORY_MATCH_TOLERANCE * expected:
                return name
            break
    return re.sub(r"^(NVIDIA|Tesla)\s+", "", product_name.strip(), flags=re.IGNORECASE)


def is_simulated(machine: Machine) -> bool:
    """True for a machine built by ``discover(simulate=…)`` (its GPUs carry the fake UUID prefix)."""
    return all(g.uuid.startswith(SIMULATED_UUID_PREFIX) for g in machine.gpus)


def _mig_table(model: str) -> MigGpu | None:
    try:
        return mig_gpu(model)
    except UnknownMigGpu:
        return None


def _simulated(spec: str, instance: str = "") -> Machine:
    """``PROFILE[@MODEL][:mig]`` → a Machine from the built-in profile."""
    name, _, flag = spec.partition(":")
    name, _, model = name.partition("@")
    if flag not in ("", "mig"):
        raise UserError(f"--simulate {spec!r}: the only option after ':' is 'mig' (e.g. dgx-a100:mig)")
    topology: Topology = profile(name.strip())
    model = model.strip() or topology.gpu_model or DEFAULT_SIMULATED_MODEL
    if model not in GPU_MODELS:
        raise UserError(
            f"--simulate {spec!r}: {model!r} is not a known GPU model; known: {', '.join(GPU_MODELS)}"
        )
    table = _mig_table(model)
    if flag == "mig" and table is None:
        raise UserError(
            f"--simulate {spec!r}: {model} cannot do MIG; MIG models: A100-40GB, A100-80GB, H100, H200"
        )
    digest = hashlib.sha1(f"{topology.name}@{model}|{instance}".encode()).hexdigest()[:8]
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"{SIMULATED_UUID_PREFIX}{digest}-{i:04d}",
            model=model,
            memory_bytes=GPU_MODELS[model].memory_bytes,
            mig_enabled=flag == "mig",
            mig_model=table.key if table else "",
        )
        for i in range(topology.n_gpus)
    )
    return Machine(name=f"sim-{topology.name}", gpus=gpus, topology=topology)


def _mig_state(nvml: Any, handle: Any) -> tuple[bool, str]:
    """(MIG mode on now, MIG table key or "")."""
    try:
        key = detect_gpu(nvml, handle).key
    except UserError:
        key = ""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:  # NOT_SUPPORTED on GPUs without MIG
        return False, key
    return int(current) == int(getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)), key


def _real(nvml: Any) -> Machine:
    count = int(nvml.nvmlDeviceGetCount())
    if count == 0:
        raise NoGpuDriver(f"NVML works but reports no GPUs on this machine; {_HINT}")
    gpus = []
    for i in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        name = _text(nvml.nvmlDeviceGetName(handle))
        mig_on, mig_key = _mig_state(nvml, handle)
        if mig_on and not mig_key:
            raise UserError(
                f"GPU {i} ({name}) is in MIG mode but gpuslice has no MIG table for it; turn MIG off "
                f"(sudo nvidia-smi -i {i} -mig 0) or use another --sharing mode on other GPUs"
            )
        gpus.append(
            GpuInfo(
                index=i,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                model=catalogue_model(name, memory),
                memory_bytes=memory,
                mig_enabled=mig_on,
                mig_model=mig_key,
            )
        )
    topology: Topology | None
    try:
        topology = read_nvml_topology(nvml, name=socket.gethostname())
    except (TopologyError, nvml.NVMLError) as e:
        log.warning("GPU topology could not be read through NVML (%s); placing without it", e)
        topology = None
    return Machine(
        name=socket.gethostname(),
        gpus=tuple(gpus),
        topology=topology,
        cpu_milli=(os.cpu_count() or 1) * 1000,
        memory_bytes=psutil.virtual_memory().total,
    )


_shared_nvml: ModuleType | None = None  # pynvml, initialised once and kept open for the monitor's polling


@contextlib.contextmanager
def _session(nvml: Any | None) -> Iterator[Any]:
    """An initialised NVML: the given module (initialised here and shut down after; NVML counts inits),
    or the process-wide pynvml, opened on first use and left open (nvmlInit can take 100s of ms)."""
    global _shared_nvml
    if nvml is None:
        if _shared_nvml is None:
            _shared_nvml = load_nvml()
        yield _shared_nvml
        return
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        raise NoGpuDriver(f"no NVIDIA driver/NVML found ({e}); {_HINT}") from None
    try:
        yield nvml
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def discover(simulate: str | None = None, *, nvml: Any | None = None, instance: str = "") -> Machine:
    """This machine's GPUs (NVML), or the simulated machine ``simulate`` names; NoGpuDriver otherwise.

    ``instance`` (a server passes its state directory) goes into the simulated GPUs' UUIDs, so two
    simulated servers on one host have different GPUs: a fake load reports memory under its server's
    UUIDs, and the other server, which cannot resolve them, never counts it.
    """
    if simulate:
        return _simulated(simulate, instance)
    with _session(nvml) as opened:
        return _real(opened)


def gpu_processes(nvml: Any | None = None) -> dict[int, dict[int, int]]:
    """Per GPU index, {pid: GPU memory bytes} of every process NVML lists (compute and graphics).

    NVML reports host PIDs; a process whose memory NVML cannot give (``usedGpuMemory`` None, e.g. some
    containers or MIG without privileges) counts 0 bytes, so it is still seen as present."""
    result: dict[int, dict[int, int]] = {}
    with _session(nvml) as nvml:
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            on_gpu: dict[int, int] = {}
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                call = getattr(nvml, getter, None)
                if call is None:
                    continue
                try:
                    processes = call(handle)
                except nvml.NVMLError:
                    continue
                for p in processes:
                    used = int(p.usedGpuMemory or 0)
                    on_gpu[int(p.pid)] = max(on_gpu.get(int(p.pid), 0), used)
            result[i] = on_gpu
    return result


def find_mig_device_uuid(gpu: int, profile_name: str, start: int, *, nvml: Any | None = None) -> str:
    """The ``MIG-…`` UUID of the instance of ``profile_name`` placed at memory slot ``start`` on ``gpu``.

    NVML: ``nvmlDeviceGetMigDeviceHandleByIndex`` walks the MIG devices; each one's GPU instance
    (``nvmlDeviceGetGpuInstanceId`` → ``nvmlDeviceGetGpuInstanceById`` → ``nvmlGpuInstanceGetInfo``)
    gives its profile id and placement start (NVML API reference, ``nvml.h``)."""
    with _session(nvml) as nvml:
        parent = nvml.nvmlDeviceGetHandleByIndex(gpu)
        wanted = detect_gpu(nvml, parent).profile(profile_name)
        for k in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))):
            try:
                device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, k)
            except nvml.NVMLError:
                continue  # an empty slot in the MIG device list
            instance = nvml.nvmlDeviceGetGpuInstanceById(parent, nvml.nvmlDeviceGetGpuInstanceId(device))
            info = nvml.nvmlGpuInstanceGetInfo(instance)
            if info.profileId == wanted.profile_id and info.placement.start == start:
                return _text(nvml.nvmlDeviceGetUUID(device))
    raise MigInstanceMissing(
        f"GPU {gpu} has no {wanted.name} MIG instance at memory slot {start}; gpuslice does not create "
        "MIG instances (that needs root): create it with "
        f"sudo nvidia-smi mig -i {gpu} -cgi {wanted.profile_id} -C"
    )


# ---- telemetry and faults ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NvmlReading:
    """One GPU as NVML reports it now; None where NVML cannot say (NOT_SUPPORTED on that GPU)."""

    index: int
    utilization_percent: float | None
    memory_used_bytes: int | None
    temperature_celsius: float | None
    power_watts: float | None
    ecc_uncorrected: int | None  # volatile (since driver load) uncorrected ECC errors


def _maybe(nvml: Any, call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except nvml.NVMLError:
        return None


def gpu_telemetry(nvml: Any | None = None) -> list[NvmlReading]:
    """Utilisation, memory used, temperature, power and uncorrected ECC errors of every GPU."""
    readings = []
    with _session(nvml) as nvml:
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            util = _maybe(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = _maybe(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
            temp = _maybe(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
            milliwatts = _maybe(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
            ecc = _maybe(
                nvml, nvml.nvmlDeviceGetTotalEccErrors, handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC,
            )  # fmt: skip
            readings.append(
                NvmlReading(
                    index=i,
                    utilization_percent=None if util is None else float(util.gpu),
                    memory_used_bytes=None if memory is None else int(memory.used),
                    temperature_celsius=None if temp is None else float(temp),
                    power_watts=None if milliwatts is None else milliwatts / 1000,
                    ecc_uncorrected=None if ecc is None else int(ecc),
                )
            )
    return readings
