"""Built-in machine profiles: real GPU link matrices, for tests, ``--simulate`` and the benchmark.

Every matrix is the ``nvidia-smi topo -m`` GPU × GPU block published for that machine, in public sources
(docs/references.md, "GPU topology"); bandwidths follow NVIDIA's NVLink figures and the PCIe specifications.
Facts inferred rather than published say so where they are set, so they are easy to correct.
"""

from __future__ import annotations

from gpuslice.errors import UnknownName
from gpuslice.hardware.topology import PCIE_GBPS, BandwidthModel, Topology, TopologyError, build_topology

__all__ = ["PROFILES", "UnknownSystem", "profile", "profile_names"]


class UnknownSystem(TopologyError, UnknownName):
    """A ``--system`` name is not a built-in profile."""


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def _uniform(n: int, cell: str) -> list[list[str]]:
    return [["X" if i == j else cell for j in range(n)] for i in range(n)]


def _by_group(groups: list[list[int]], inside: str, outside: str) -> list[list[str]]:
    """A label matrix where GPUs in the same group get ``inside`` and the rest ``outside``."""
    group_of = {g: k for k, members in enumerate(groups) for g in members}
    n = len(group_of)
    return [
        ["X" if i == j else inside if group_of[i] == group_of[j] else outside for j in range(n)]
        for i in range(n)
    ]


def _overlay(*layers: list[list[str]]) -> list[list[str]]:
    """Cell by cell, the first layer's label that is not '-'."""
    n = len(layers[0])
    return [[next(layer[i][j] for layer in layers if layer[i][j] != "-") for j in range(n)] for i in range(n)]


# DGX-1 with V100: hybrid cube-mesh, 6 NVLink2 per GPU (go-gpuallocator ``NewDGX1VoltaNode``).
_DGX1_V100 = _rows("""
X   NV1 NV1 NV2 NV2 SYS SYS SYS
NV1 X   NV2 NV1 SYS NV2 SYS SYS
NV1 NV2 X   NV2 SYS SYS NV1 SYS
NV2 NV1 NV2 X   SYS SYS SYS NV1
NV2 SYS SYS SYS X   NV1 NV1 NV2
SYS NV2 SYS SYS NV1 X   NV2 NV1
SYS SYS NV1 SYS NV1 NV2 X   NV2
SYS SYS SYS NV1 NV2 NV1 NV2 X
""")
# Its PCIe tree (same fixture): {0,1},{2,3},{4,5},{6,7} share a switch (PIX), same socket PHB, else SYS.
_PAIRS_8 = [[0, 1], [2, 3], [4, 5], [6, 7]]
_HALVES_8 = [[0, 1, 2, 3], [4, 5, 6, 7]]
_DGX1_PCIE = _overlay(_by_group(_PAIRS_8, "PIX", "-"), _by_group(_HALVES_8, "PHB", "SYS"))

# DGX A100 captured layout (published ``nvidia-smi topo -m``): NPS4, 8 NUMA nodes; each GPU pair behind one
# PCIe switch tree (PXB), everything else SYS. CPU lists follow EPYC numbering for 2 × 64 cores, SMT on (NUMA
# n: cores 16n…16n+15 and 128+16n…); GPU0's "48-63,176-191" matches the published capture.
_A100_NUMA = (3, 3, 1, 1, 7, 7, 5, 5)
_A100_CPUS = tuple(f"{16 * n}-{16 * n + 15},{128 + 16 * n}-{128 + 16 * n + 15}" for n in _A100_NUMA)

# 8 × PCIe GPUs on two sockets behind PCIe switches, as published in vllm-project/vllm#11122.
_PCIE_8GPU = _overlay(_by_group(_PAIRS_8, "PIX", "-"), _by_group(_HALVES_8, "PXB", "SYS"))

# 4 × L4 (PCIe Gen4, no NVLink) on one socket. INFERRED: no public L4 capture; we assume two GPUs per
# PCIe switch ({0,1}, {2,3}) and the two switches on different root ports of one host bridge (PHB).
# Correct this matrix if a real capture shows otherwise.
_PCIE_4X_L4 = _overlay(_by_group([[0, 1], [2, 3]], "PIX", "PHB"))

_SOCKETS_8 = (0, 0, 0, 0, 1, 1, 1, 1)  # GPU0–3 on NUMA 0, GPU4–7 on NUMA 1 (DGX-1, H100/H200, PCIe captures)

PROFILES: dict[str, Topology] = {
    t.name: t
    for t in (
        build_topology(
            "dgx1-v100",
            _DGX1_V100,
            pcie_labels=_DGX1_PCIE,
            numa=_SOCKETS_8,
            gpu_model="V100M16",
            bandwidth=BandwidthModel(pcie_gbps=PCIE_GBPS[3]),
            source="DGX-1 V100 hybrid cube-mesh, 6 × NVLink2 per GPU (go-gpuallocator NewDGX1VoltaNode)",
        ),
        build_topology(
            "dgx-a100",
            _uniform(8, "NV12"),
            pcie_labels=_by_group(_PAIRS_8, "PXB", "SYS"),
            numa=_A100_NUMA,
            cpu_affinity=_A100_CPUS,
            gpu_model="A100-80GB",
            bandwidth=BandwidthModel(pcie_gbps=PCIE_GBPS[4]),
            source="DGX A100: 6 NVSwitch gen 2, 12 × NVLink3 per GPU, NV12 all pairs (DGX A100 user guide)",
        ),
        build_topology(
            "dgx-h100",
            _uniform(8, "NV18"),
            numa=_SOCKETS_8,  # PCIe path under NV18 not published: NODE same socket, SYS across (inferred)
            gpu_model="H100",
            bandwidth=BandwidthModel(pcie_gbps=PCIE_GBPS[5]),
            source="DGX H100: 4 NVSwitch gen 3, 18 × NVLink4 per GPU, NV18 all pairs (published topo -m)",
        ),
        build_topology(
            "hgx-h200",
            _uniform(8, "NV18"),
            numa=_SOCKETS_8,  # as dgx-h100: same NVLink4/NVSwitch board (MLCommons H200-SXM-141GBx8)
            gpu_model="H200",
            bandwidth=BandwidthModel(pcie_gbps=PCIE_GBPS[5]),
            source="HGX H200 8-GPU: NVLink4 through NVSwitch, NV18 all pairs (MLCommons H200 system json)",
        ),
        build_topology(
            "pcie-8gpu-2socket",
            _PCIE_8GPU,
            numa=_SOCKETS_8,
            bandwidth=BandwidthModel(pcie_gbps=PCIE_GBPS[4]),  # Gen4 assumed (inferred)
            source="8 × PCIe GPU, 2 sockets, 2 GPUs per leaf switch, no NVLink (vllm-project/vllm#11122)",
        ),
        build_topology(
            "pcie-4x-l4",
            _PCIE_4X_L4,
            numa=(0, 0, 0, 0),
            gpu_model="L4",
            bandwidth=BandwidthModel(pcie_gbps=PCIE_GBPS[4]),
            source="4 × L4 PCIe Gen4, one socket; switch layout INFERRED (no public capture)",
        ),
    )
}


def profile_names() -> list[str]:
    return list(PROFILES)


def profile(name: str) -> Topology:
    """The built-in profile ``name``; UnknownSystem lists the known names otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownSystem(f"{name!r} is not a built-in system; known: {', '.join(PROFILES)}") from None
