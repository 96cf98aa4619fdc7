"""GPU models gpuslice knows by name, with their memory.

Memory is what the driver reports as total (nvidia-smi "Total", NVML ``memoryInfo.total``), not the
marketing figure: a "16 GB" V100 shows 16160 MiB. The openb models (G2, G3, T4, P100, V100M16, V100M32,
A10) use the figures of the FGD artifact's ``MapGpuTypeMemoryMiB``
(hkust-adsl/kubernetes-scheduler-simulator, ``pkg/type/open-gpu-share/utils/const.go``); G2 and G3 are
Alibaba-internal models whose memory the artifact gives as 20000 and 30000 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.errors import UnknownGpuModel
from gpuslice.units import MiB

__all__ = ["GPU_MODELS", "GpuModel", "gpu_model"]


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU product: its short name (as in traces and ``--gpu-model``), its memory in bytes, and the
    vendor's name for it as a person reads it in a list (``V100 16GB`` for openb's ``V100M16``)."""

    name: str
    memory_bytes: int
    description: str
    vendor_name: str


def _model(name: str, memory_mib: int, description: str, vendor_name: str = "") -> GpuModel:
    return GpuModel(name, memory_mib * MiB, description, vendor_name or name)


GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        # openb trace models (memory from the FGD artifact, see module docstring)
        _model("G2", 20000, "Alibaba-internal model G2 (openb)", "openb G2 (20 GB)"),
        _model("G3", 30000, "Alibaba-internal model G3 (openb)", "openb G3 (30 GB)"),
        _model("T4", 15109, "NVIDIA Tesla T4 16GB", "T4 16GB"),
        _model("P100", 16280, "NVIDIA Tesla P100 PCIe 16GB", "P100 16GB"),
        _model("V100M16", 16160, "NVIDIA Tesla V100 SXM2 16GB", "V100 16GB"),
        _model("V100M32", 32510, "NVIDIA Tesla V100 SXM2 32GB", "V100 32GB"),
        _model("A10", 22731, "NVIDIA A10 24GB", "A10 24GB"),
        # current data-centre models (nvidia-smi totals)
        _model("A100-40GB", 40960, "NVIDIA A100 SXM4/PCIe 40GB", "A100 40GB"),
        _model("A100-80GB", 81920, "NVIDIA A100 SXM4/PCIe 80GB", "A100 80GB"),
        _model("H100", 81559, "NVIDIA H100 SXM5/PCIe 80GB", "H100 80GB"),
        _model("H200", 143771, "NVIDIA H200 SXM5/NVL 141GB", "H200 141GB"),
        _model("L4", 23034, "NVIDIA L4 24GB", "L4 24GB"),
    )
}


def gpu_model(name: str) -> GpuModel:
    """The catalogue entry for ``name``; UnknownGpuModel lists the known names otherwise."""
    try:
        return GPU_MODELS[name]
    except KeyError:
        known = ", ".join(GPU_MODELS)
        raise UnknownGpuModel(f"{name!r} is not a known GPU model; known: {known}") from None
