"""Reading a live machine through NVML, against a fake ``pynvml`` module built from a known topology.

The fake answers the NVML topology and NVLink calls, the way the driver does: direct NVLinks report the peer
GPU's PCI bus id; on NVSwitch boards every link reports a switch, both by device type and by bus id.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from gpuslice.errors import UserError
from gpuslice.hardware.topology import LinkType, Topology
from gpuslice.hardware.topology_nvml import NvmlUnavailable, load_pynvml, read_nvml_topology
from gpuslice.hardware.topology_profiles import profile
from gpuslice.policies.gpuset.link_points import pair_points

_NVML_LEVEL = {LinkType.PIX: 10, LinkType.PXB: 20, LinkType.PHB: 30, LinkType.NODE: 40, LinkType.SYS: 50}


class FakeNVMLError(Exception):
    pass


def fake_pynvml(
    topo: Topology, *, with_device_type: bool = True, init_fails: bool = False
) -> types.ModuleType:
    n = topo.n_gpus
    bus = [f"00000000:{0x10 + i:02X}:00.0".encode() for i in range(n)]
    switch_bus = b"00000000:F0:00.0"
    links: list[list[tuple[str, int]]] = [[] for _ in range(n)]  # per GPU: (kind, peer) per link index
    if topo.nvswitch:
        for i in range(n):
            links[i] = [("switch", -1)] * int(topo.nvlinks[i].max())
    else:
        for i in range(n):
            for j in range(n):
                links[i] += [("gpu", j)] * int(topo.nvlinks[i, j])
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    m.shutdowns = 0

    def init() -> None:
        if init_fails:
            raise FakeNVMLError("Driver Not Loaded")

    def shutdown() -> None:
        m.shutdowns += 1

    def link_of(h: int, link: int) -> tuple[str, int]:
        if link >= len(links[h]):
            raise FakeNVMLError("Not Supported")
        return links[h][link]

    m.nvmlInit = init
    m.nvmlShutdown = shutdown
    m.nvmlDeviceGetCount = lambda: n
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: b"NVIDIA Fake GPU"
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus[h])
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: _NVML_LEVEL[topo.pcie_link(a, b)]
    m.nvmlDeviceGetNvLinkState = lambda h, link: (link_of(h, link), 1)[1]
    m.nvmlDeviceGetNumaNodeId = lambda h: topo.numa[h]

    def remote_pci(h: int, link: int) -> types.SimpleNamespace:
        kind, peer = link_of(h, link)
        return types.SimpleNamespace(busId=switch_bus if kind == "switch" else bus[peer].lower())

    m.nvmlDeviceGetNvLinkRemotePciInfo_v2 = remote_pci
    if with_device_type:
        m.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: 2 if link_of(h, link)[0] == "switch" else 0
    return m


@pytest.mark.parametrize("system", ["dgx1-v100", "dgx-a100", "dgx-h100", "pcie-8gpu-2socket", "pcie-4x-l4"])
def test_nvml_read_reproduces_the_machine(system):
    expected = profile(system)
    fake = fake_pynvml(expected)
    got = read_nvml_topology(fake)
    np.testing.assert_array_equal(got.nvlinks, expected.nvlinks)
    np.testing.assert_array_equal(got.pcie, expected.pcie)
    assert got.nvswitch == expected.nvswitch
    assert got.numa == expected.numa
    assert got.gpu_model == "NVIDIA Fake GPU"
    assert fake.shutdowns == 1


def test_without_the_device_type_call_nvswitch_links_are_invisible_as_in_go_gpuallocator():
    # go-gpuallocator's blind spot: matching remote bus ids against GPUs finds only the switch, so no NVLink.
    a100 = profile("dgx-a100")
    blind = read_nvml_topology(fake_pynvml(a100, with_device_type=False))
    assert not blind.nvlinks.any() and not blind.nvswitch
    # …which is exactly what besteffort's point table sees on the real profile.
    seen = pair_points(blind, see_nvswitch=True)
    np.testing.assert_array_equal(seen, pair_points(a100, see_nvswitch=False))


def test_no_driver_is_a_clear_user_error():
    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver") as info:
        read_nvml_topology(fake_pynvml(profile("dgx1-v100"), init_fails=True))
    assert isinstance(info.value, UserError)


def test_missing_nvidia_ml_py_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(NvmlUnavailable, match="install nvidia-ml-py"):
        load_pynvml()
