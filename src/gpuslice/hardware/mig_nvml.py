"""Read a GPU's MIG layout (and its real profile table) from NVML through nvidia-ml-py.

What: ``read_layout(index)`` → the ``MigLayout`` of one GPU (each GI's profile, start, GI id and CI ids);
``read_profiles(index)`` → what the driver says each profile is, and ``compare_with_table`` → where the
built-in table (``hardware/mig.py``; H200 inferred) disagrees with it.
Why: the planner starts from the node's real layout, and the H200 facts need checking on hardware.

NVML calls (NVML API reference, ``nvml.h``): ``nvmlDeviceGetMigMode`` → [current, pending];
``nvmlDeviceGetGpuInstanceProfileInfo(device, NVML_GPU_INSTANCE_PROFILE_*)`` → ``.id`` (the ``-lgip`` ID),
``.sliceCount``, ``.memorySizeMB`` …; ``nvmlDeviceGetGpuInstances(device, info.id, array, byref(count))``
and ``nvmlGpuInstanceGetInfo(gi)`` → ``.id``, ``.profileId``, ``.placement.start/.size``;
``nvmlGpuInstanceGetComputeInstanceProfileInfo`` + ``nvmlGpuInstanceGetComputeInstances`` +
``nvmlComputeInstanceGetInfo`` → CI ids. ``pynvml`` is imported lazily; tests pass a fake module as ``nvml``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpuslice.errors import NvmlUnavailable, Unavailable, UserError
from gpuslice.hardware.mig import MIG_GPUS, MigGpu, MigInstance, MigLayout
from gpuslice.units import GiB, MiB

__all__ = [
    "MigNotEnabled",
    "NvmlUnavailable",
    "ObservedProfile",
    "compare_with_table",
    "detect_gpu",
    "load_nvml",
    "read_layout",
    "read_profiles",
]

_MAX_INSTANCES = 8  # at most 7 GIs per GPU (MIG user guide); 8 leaves room for a driver surprise


class MigNotEnabled(Unavailable):
    """The GPU is not in MIG mode (or its MIG mode change is pending a reset)."""


def load_nvml() -> Any:
    """``pynvml``, initialised; NvmlUnavailable says what to install or check otherwise."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable(
            "reading MIG state needs NVML: install nvidia-ml-py (pip install nvidia-ml-py)"
        ) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        raise NvmlUnavailable(f"NVML could not start ({err}): no NVIDIA driver on this machine?") from None
    return pynvml


@dataclass(frozen=True, slots=True)
class ObservedProfile:
    """One GI profile as the driver reports it."""

    name_hint: str  # the NVML constant's name, e.g. "NVML_GPU_INSTANCE_PROFILE_3_SLICE"
    nvml_constant: int
    profile_id: int
    slice_count: int
    instance_count: int
    sm_count: int
    memory_bytes: int


def _constants(nvml: Any) -> dict[str, int]:
    return {
        name: getattr(nvml, name)
        for name in dir(nvml)
        if name.startswith("NVML_GPU_INSTANCE_PROFILE_") and name != "NVML_GPU_INSTANCE_PROFILE_COUNT"
    }


def detect_gpu(nvml: Any, handle: Any) -> MigGpu:
    """Which MIG table fits this device, from its name and total memory; UserError if none does."""
    name = nvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else str(name)
    total = nvml.nvmlDeviceGetMemoryInfo(handle).total
    upper = name.upper()
    if "A100" in upper:
        key = "a100-80gb" if total > 60 * GiB else "a100-40gb"
    elif "H200" in upper:
        key = "h200-141gb"
    elif "H100" in upper and "NVL" in upper:
        key = "h100-nvl-94gb"
    elif "H100" in upper and total < 88 * GiB:  # GH200 96 GB has other profiles
        key = "h100-pcie-80gb" if "PCIE" in upper else "h100-80gb"  # "NVIDIA H100 PCIe": 114 SMs
    else:
        raise UserError(f"{name} has no built-in MIG table; known: {', '.join(MIG_GPUS)}")
    return MIG_GPUS[key]


def read_profiles(index: int, nvml: Any | None = None) -> tuple[ObservedProfile, ...]:
    """Every GI profile the driver supports on GPU ``index`` (unsupported constants are skipped)."""
    nvml = nvml if nvml is not None else load_nvml()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    seen = []
    for hint, const in sorted(_constants(nvml).items(), key=lambda kv: kv[1]):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, const)
        except nvml.NVMLError:
            continue
        seen.append(
            ObservedProfile(
                hint,
                const,
                info.id,
                info.sliceCount,
                info.instanceCount,
                info.multiprocessorCount,
                info.memorySizeMB * MiB,
            )
        )
    return tuple(seen)


def compare_with_table(gpu: MigGpu, observed: tuple[ObservedProfile, ...]) -> list[str]:
    """One line per disagreement between the built-in table and the driver; empty when they agree."""
    by_id = {o.profile_id: o for o in observed}
    lines = []
    for p in gpu.profiles:
        o = by_id.get(p.profile_id)
        if o is None:
            lines.append(f"{p.name}: ID {p.profile_id} not reported by the driver")
            continue
        for field, ours, theirs in (
            ("NVML constant", p.nvml_constant, o.nvml_constant),
            ("compute slices", p.compute_slices, o.slice_count),
            ("max instances", p.max_count, o.instance_count),
            ("SMs", p.sm_count, o.sm_count),
            ("memory MiB", p.memory_bytes // MiB, o.memory_bytes // MiB),
        ):
            if ours != theirs:
                lines.append(f"{p.name}: {field} table {ours}, driver {theirs}")
    return lines


def _gpu_instances(nvml: Any, handle: Any, profile_id: int) -> list[Any]:
    array = (nvml.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
    count = ctypes.c_uint(_MAX_INSTANCES)
    nvml.nvmlDeviceGetGpuInstances(handle, profile_id, array, ctypes.byref(count))
    return [array[i] for i in range(count.value)]


def _compute_instance_ids(nvml: Any, gi: Any) -> tuple[int, ...]:
    ids: list[int] = []
    shared = getattr(nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
    for const in range(getattr(nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 8)):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, const, shared)
        except nvml.NVMLError:
            continue
        array = (nvml.c_nvmlComputeInstance_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(_MAX_INSTANCES)
        nvml.nvmlGpuInstanceGetComputeInstances(gi, info.id, array, ctypes.byref(count))
        ids += [nvml.nvmlComputeInstanceGetInfo(array[i]).id for i in range(count.value)]
    return tuple(sorted(ids))


def read_layout(index: int, nvml: Any | ModuleType | None = None) -> MigLayout:
    """The GPU instances on GPU ``index``, all marked in use (NVML cannot say which are idle)."""
    nvml = nvml if nvml is not None else load_nvml()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    gpu = detect_gpu(nvml, handle)
    current, pending = nvml.nvmlDeviceGetMigMode(handle)
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        note = " (enable is pending a GPU reset)" if pending == nvml.NVML_DEVICE_MIG_ENABLE else ""
        raise MigNotEnabled(f"GPU {index} is not in MIG mode{note}: nvidia-smi -i {index} -mig 1, then reset")
    by_id = {p.profile_id: p for p in gpu.profiles}
    layout = MigLayout(gpu)
    for p in gpu.profiles:
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, p.nvml_constant)
        except nvml.NVMLError:
            continue
        for gi in _gpu_instances(nvml, handle, info.id):
            gi_info = nvml.nvmlGpuInstanceGetInfo(gi)
            profile = by_id.get(gi_info.profileId, p)
            layout = layout.with_instance(
                MigInstance(profile, gi_info.placement.start, gi_info.id, _compute_instance_ids(nvml, gi))
            )
    return layout
