"""Read a live machine's GPU topology through NVML (nvidia-ml-py's ``pynvml``).

Per pair, the PCIe path comes from ``nvmlDeviceGetTopologyCommonAncestor`` (NVML ``nvmlGpuTopologyLevel_t``).
NVLinks come from walking each GPU's links 0…NVML_NVLINK_MAX_LINKS−1: an active link whose far end is a GPU
counts for that GPU (matched by PCI bus id from ``nvmlDeviceGetNvLinkRemotePciInfo_v2``); a link whose far end
is an NVSwitch (``nvmlDeviceGetNvLinkRemoteDeviceType == SWITCH``) counts for the GPU's switch links, and two
GPUs that both reach switches get min(switch links of A, of B) — what ``nvidia-smi topo -m`` shows as
NV12/NV18. go-gpuallocator only does the bus-id match and so sees no NVLink at all on NVSwitch boards
(``internal/links/device.go``: "TODO: Handle NVSwitch semantics"); that is the blind spot this module closes.

``pynvml`` is imported only when a live read is asked for; tests pass a fake module instead.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from gpuslice.errors import NvmlUnavailable
from gpuslice.hardware.topology import BandwidthModel, LinkType, Topology, TopologyError, build_topology

__all__ = ["NvmlUnavailable", "load_pynvml", "read_nvml_topology"]

# nvmlGpuTopologyLevel_t values (nvml.h) → the PCIe path code nvidia-smi prints. INTERNAL (same board,
# e.g. a dual-GPU K80) has no nvidia-smi code; it is at least as close as PIX, so it reads as PIX.
_LEVELS: dict[int, LinkType] = {
    0: LinkType.PIX,  # NVML_TOPOLOGY_INTERNAL
    10: LinkType.PIX,  # NVML_TOPOLOGY_SINGLE
    20: LinkType.PXB,  # NVML_TOPOLOGY_MULTIPLE
    30: LinkType.PHB,  # NVML_TOPOLOGY_HOSTBRIDGE
    40: LinkType.NODE,  # NVML_TOPOLOGY_NODE (old alias NVML_TOPOLOGY_CPU)
    50: LinkType.SYS,  # NVML_TOPOLOGY_SYSTEM
}
_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS (nvml.h); older GPUs answer NOT_SUPPORTED past theirs
_FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED
_DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH (nvml.h)


def load_pynvml() -> ModuleType:
    """Import ``pynvml``; NvmlUnavailable says what to install if it is missing."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailable(
            "reading the local topology needs NVML: install nvidia-ml-py (pip install nvidia-ml-py) "
            "on a machine with an NVIDIA driver, or use --system NAME / --from-file FILE"
        ) from None


def _bus_key(pci: Any) -> tuple[int, int, int, int]:
    """(domain, bus, device, function) from a PCI info's busId, e.g. '00000000:07:00.0' or b'0000:07:00.0'."""
    bus_id = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
    domain, bus, devfn = bus_id.strip().lower().split(":")
    device, function = devfn.split(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)


def _const(nvml: ModuleType, name: str, default: int) -> int:
    return int(getattr(nvml, name, default))


def _nvlinks(
    nvml: ModuleType, handle: Any, bus_index: dict[tuple[int, int, int, int], int]
) -> tuple[dict[int, int], int]:
    """(links per peer GPU index, links to NVSwitches) for one GPU; absent link indices are skipped."""
    enabled = _const(nvml, "NVML_FEATURE_ENABLED", _FEATURE_ENABLED)
    switch_type = _const(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", _DEVICE_TYPE_SWITCH)
    peers: dict[int, int] = {}
    to_switch = 0
    for link in range(_const(nvml, "NVML_NVLINK_MAX_LINKS", _MAX_LINKS)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != enabled:
                continue
        except nvml.NVMLError:
            continue  # NOT_SUPPORTED: this GPU has no link with that index
        remote_type = None
        getter = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        if getter is not None:
            try:
                remote_type = getter(handle, link)
            except nvml.NVMLError:
                remote_type = None
        if remote_type == switch_type:
            to_switch += 1
            continue
        try:
            remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(handle, link)
        except nvml.NVMLError:
            continue
        peer = bus_index.get(_bus_key(remote))
        if peer is not None:  # else an IBM NPU, or a switch on a driver without the device-type call
            peers[peer] = peers.get(peer, 0) + 1
    return peers, to_switch


def _numa(nvml: ModuleType, handle: Any) -> int:
    getter = getattr(nvml, "nvmlDeviceGetNumaNodeId", None)  # newer bindings only
    if getter is None:
        return -1
    try:
        return int(getter(handle))
    except nvml.NVMLError:
        return -1


def read_nvml_topology(
    nvml: ModuleType | None = None, *, name: str = "local", bandwidth: BandwidthModel | None = None
) -> Topology:
    """The topology of this machine's GPUs, read through NVML; ``nvml`` defaults to ``pynvml``."""
    nvml = nvml or load_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        raise NvmlUnavailable(
            f"NVML could not start ({err}): no NVIDIA driver is loaded here; "
            "use --system NAME or --from-file FILE instead"
        ) from None
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            raise NvmlUnavailable("NVML reports no GPUs on this machine; use --system NAME instead")
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        bus_index = {_bus_key(nvml.nvmlDeviceGetPciInfo(h)): i for i, h in enumerate(handles)}
        links = [_nvlinks(nvml, h, bus_index) for h in handles]
        labels = [["X"] * count for _ in range(count)]
        pcie = [["X"] * count for _ in range(count)]
        for i in range(count):
            for j in range(count):
                if i == j:
                    continue
                level = _LEVELS.get(int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])))
                if level is None:
                    raise TopologyError(f"NVML gave an unknown topology level for GPU{i}–GPU{j}")
                pcie[i][j] = level.value
                (peers_i, switch_i), (peers_j, switch_j) = links[i], links[j]
                direct = min(peers_i.get(j, 0), peers_j.get(i, 0))  # both ends must see the link
                through_switch = min(switch_i, switch_j)  # effective count on switch systems
                nv = direct or through_switch
                labels[i][j] = f"NV{nv}" if nv else level.value
        nvswitch = any(switch for _, switch in links) and not any(peers for peers, _ in links)
        name_of = nvml.nvmlDeviceGetName(handles[0])
        return build_topology(
            name,
            labels,
            pcie_labels=pcie,
            nvswitch=nvswitch,
            numa=[_numa(nvml, h) for h in handles],
            gpu_model=name_of.decode() if isinstance(name_of, bytes) else str(name_of),
            bandwidth=bandwidth,
            source="NVML (nvidia-ml-py)",
        )
    finally:
        nvml.nvmlShutdown()
