"""What a DRA device says about the GPU behind it beyond the ``Machine``: PCI address, PCIe root, CUDA
compute capability. Read through NVML and sysfs on a real node, made up (like the UUIDs) on a simulated one.

``resource.kubernetes.io/pciBusID`` and ``resource.kubernetes.io/pcieRoot`` are the standard attributes
other drivers (NICs) publish too, so a claim can ask for a GPU and a NIC under the same PCIe root with a
``matchAttribute`` constraint (Kubernetes "Dynamic Resource Allocation" docs; docs/references.md).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuslice.hardware.machine import Machine
from gpuslice.node.discovery import is_simulated, load_nvml

__all__ = ["GpuIdentity", "gpu_identities", "normal_bus_id", "pcie_root_of"]

log = logging.getLogger(__name__)

_SYSFS_PCI = Path("/sys/bus/pci/devices")


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """One GPU's PCI address ("0000:3b:00.0"), PCIe root ("pci0000:3a") and compute capability ("9.0");
    "" where unknown (the attribute is then left out of the ResourceSlice)."""

    pci_bus_id: str = ""
    pcie_root: str = ""
    compute_capability: str = ""


def normal_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" as sysfs and Kubernetes write it: "0000:3b:00.0" (4-digit domain)."""
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest}" if rest else ""


def pcie_root_of(bus_id: str, sysfs: Path = _SYSFS_PCI) -> str:
    """The PCIe root complex above ``bus_id``: the "pciDDDD:BB" directory its sysfs path resolves under."""
    try:
        real = Path(os.path.realpath(sysfs / bus_id))
    except OSError:
        return ""
    return next((part for part in real.parts if part.startswith("pci")), "")


def gpu_identities(machine: Machine, *, nvml: Any | None = None) -> dict[int, GpuIdentity]:
    """Per GPU index, its ``GpuIdentity``. Simulated GPUs get bus ``0000:<0x10+index>:00.0`` under one
    root per NUMA node (so a NUMA-aware claim behaves as on a two-socket server)."""
    if is_simulated(machine):
        numa = machine.topology.numa if machine.topology is not None else (-1,) * machine.gpu_count
        return {
            g.index: GpuIdentity(f"0000:{0x10 + g.index:02x}:00.0", f"pci{max(numa[g.index], 0):04x}:00", "")
            for g in machine.gpus
        }
    nvml = nvml if nvml is not None else load_nvml()
    found: dict[int, GpuIdentity] = {}
    for g in machine.gpus:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(g.index)
            raw = nvml.nvmlDeviceGetPciInfo(handle).busId
            bus = normal_bus_id(raw.decode() if isinstance(raw, bytes) else str(raw))
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            found[g.index] = GpuIdentity(bus, pcie_root_of(bus) if bus else "", f"{major}.{minor}")
        except nvml.NVMLError as err:  # an old driver without one of the calls: publish without them
            log.warning(
                "GPU %d: PCI address or compute capability not readable through NVML: %s", g.index, err
            )
            found[g.index] = GpuIdentity()
    return found
