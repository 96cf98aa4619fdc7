"""How the GPUs of one machine are wired: link types, a per-pair link matrix, bandwidth and hop distance.

A pair of GPUs has up to two connections, as in NVML (``nvml.h``; docs/references.md, "GPU topology"):
a PCIe path (``PIX`` … ``SYS``, from ``nvmlDeviceGetTopologyCommonAncestor``) and a number of NVLinks
(direct, or through NVSwitch, where the effective count is min(active links of A, of B)).
``nvidia-smi topo -m`` shows only the best of the two (``NV#`` hides the PCIe path); the
``Topology`` keeps both, because go-gpuallocator's ``besteffort`` scores both (``besteffort_policy.go``).

Two configurable models turn links into numbers:

- ``BandwidthModel``: GB/s per direction of a pair: NVLink 2/3/4 carry 25 GB/s per link per
  direction, so a pair's NVLink bandwidth is links × 25; a PCIe-only pair gets the PCIe generation's
  x16 rate times a discount that grows with the number of bridges crossed. The discounts are ours
  (public sources give only the ordering PIX > PXB > PHB > NODE > SYS, and PIX/PXB peers near link rate):
  change them in one place, ``PCIE_DISCOUNT``.
- ``CostModel``: hop distance of a pair: 0 same GPU, 1 direct NVLink, 2 through an NVSwitch, 3 PCIe only
  (our defaults; every value is a field).

A set of GPUs running a ring all-reduce is bounded by the slowest link of its best ring, so
``ring_bandwidth`` is the largest bottleneck over all rings through the set; it is what "the bus
bandwidth a multi-GPU job gets" means in the benchmark (nccl-tests' ``busbw`` of a ring all-reduce
approaches the slowest ring link's rate; a model, not a measurement).
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gpuslice.errors import UserError

__all__ = [
    "NVLINK_MAX_LINKS",
    "PCIE_DISCOUNT",
    "PCIE_GBPS",
    "BandwidthModel",
    "CostModel",
    "LinkType",
    "Topology",
    "TopologyError",
    "build_topology",
    "mask_of",
    "parse_link_label",
]

# NVML_NVLINK_MAX_LINKS in current ``nvml.h``: no GPU has more NVLinks than this. A GPU whose NV#
# counts add up to more must reach its peers through NVSwitches (DGX A100: NV12 × 7 peers = 84 links).
NVLINK_MAX_LINKS = 18

# x16 rate per direction in GB/s by PCIe generation (PCI-SIG specifications: 8/16/32 GT/s a lane).
PCIE_GBPS: dict[int, float] = {3: 15.75, 4: 31.5, 5: 63.0}


class TopologyError(UserError):
    """A topology is inconsistent (asymmetric, bad label, unknown system); the message says which pair."""


class LinkType(enum.Enum):
    """What joins two GPUs, best first; the values are the ``nvidia-smi topo -m`` codes."""

    SELF = "X"
    NVLINK = "NV#"  # direct NVLinks, # of them bonded
    NVSWITCH = "NVSwitch"  # NVLinks through NVSwitch chips (shown as NV# by nvidia-smi)
    PIX = "PIX"  # at most one PCIe bridge/switch
    PXB = "PXB"  # several PCIe bridges/switches, no host bridge
    PHB = "PHB"  # a PCIe host bridge (typically the CPU)
    NODE = "NODE"  # between host bridges inside one NUMA node
    SYS = "SYS"  # across the inter-socket link (QPI/UPI, Infinity Fabric)

    @property
    def is_pcie(self) -> bool:
        return self in _PCIE_ORDER


# PCIe path levels, best first; index + 1 is the code stored in ``Topology.pcie`` (0 = self).
_PCIE_ORDER: tuple[LinkType, ...] = (LinkType.PIX, LinkType.PXB, LinkType.PHB, LinkType.NODE, LinkType.SYS)
_PCIE_CODE: dict[LinkType, int] = {t: i + 1 for i, t in enumerate(_PCIE_ORDER)}

# Fraction of the x16 rate a PCIe-only pair gets, by path (ours; public sources give only the ordering
# and "PIX/PXB near link rate", "lower across the host bridge or the socket link").
PCIE_DISCOUNT: dict[LinkType, float] = {
    LinkType.PIX: 1.0,
    LinkType.PXB: 0.9,
    LinkType.PHB: 0.75,
    LinkType.NODE: 0.6,
    LinkType.SYS: 0.4,
}


def parse_link_label(label: str) -> tuple[int, LinkType | None]:
    """One ``nvidia-smi topo -m`` cell → (NVLink count, PCIe level or None); ValueError if unknown.

    ``X`` → (0, SELF); ``NV12`` → (12, None); ``PIX`` → (0, PIX). ``SOC`` is what older drivers printed
    for a socket-level path, before SYS/NODE existed; it is read as SYS.
    """
    text = label.strip().upper()
    if text == "X":
        return 0, LinkType.SELF
    if text.startswith("NV") and text[2:].isdigit() and 1 <= int(text[2:]) <= NVLINK_MAX_LINKS:
        return int(text[2:]), None
    if text == "SOC":
        return 0, LinkType.SYS
    for level in _PCIE_ORDER:
        if text == level.value:
            return 0, level
    raise ValueError(
        f"{label!r} is not a topology code; expected X, NV1…NV{NVLINK_MAX_LINKS}, PIX, PXB, PHB, NODE, SYS"
    )


@dataclass(frozen=True, slots=True)
class BandwidthModel:
    """Per-pair bandwidth in GB/s per direction (docs/references.md, "GPU topology"); all overridable."""

    nvlink_gbps_per_link: float = 25.0  # NVLink 2, 3 and 4 alike (NVIDIA NVLink page); NVLink 5: 50
    pcie_gbps: float = PCIE_GBPS[4]
    pcie_discount: Mapping[LinkType, float] = field(default_factory=lambda: dict(PCIE_DISCOUNT))


@dataclass(frozen=True, slots=True)
class CostModel:
    """Hop distance of a pair by how it is joined; lower is closer. The defaults are ours."""

    same_gpu: float = 0.0
    nvlink: float = 1.0
    nvswitch: float = 2.0
    pcie: float = 3.0


def mask_of(gpus: Iterable[int]) -> int:
    """A set of GPU indices as a bitmask (bit i = GPU i)."""
    mask = 0
    for g in gpus:
        mask |= 1 << g
    return mask


def _gpus_of(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


@dataclass(frozen=True, eq=False)
class Topology:
    """One machine's GPU wiring. Arrays are n × n, symmetric, read-only.

    ``nvlinks[i, j]``: NVLinks between i and j (through a switch when ``nvswitch``); ``pcie[i, j]``: PCIe
    path code (1 PIX … 5 SYS, 0 on the diagonal); ``numa[i]``: NUMA node or -1 if unknown;
    ``cpu_affinity[i]``: the CPU list nvidia-smi prints ("0-19,40-59"), "" if unknown.
    """

    name: str
    nvlinks: np.ndarray
    pcie: np.ndarray
    nvswitch: bool = False
    numa: tuple[int, ...] = ()
    cpu_affinity: tuple[str, ...] = ()
    gpu_model: str = ""
    bandwidth_model: BandwidthModel = field(default_factory=BandwidthModel)
    cost_model: CostModel = field(default_factory=CostModel)
    source: str = ""
    _ring_cache: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _hop_cache: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        nv = np.array(self.nvlinks, dtype=np.int64)
        pc = np.array(self.pcie, dtype=np.int64)
        n = nv.shape[0]
        if nv.shape != (n, n) or pc.shape != (n, n) or n == 0:
            raise TopologyError(f"topology {self.name!r}: link matrices must be square and non-empty")
        for i, j in itertools.combinations(range(n), 2):
            if nv[i, j] != nv[j, i] or pc[i, j] != pc[j, i]:
                raise TopologyError(
                    f"topology {self.name!r}: GPU{i}→GPU{j} is {self._label(nv, pc, i, j)} but "
                    f"GPU{j}→GPU{i} is {self._label(nv, pc, j, i)}; links must be symmetric"
                )
            if not 1 <= pc[i, j] <= len(_PCIE_ORDER) or not 0 <= nv[i, j] <= NVLINK_MAX_LINKS:
                raise TopologyError(f"topology {self.name!r}: GPU{i}–GPU{j} has an invalid link code")
        if np.any(np.diag(nv) != 0) or np.any(np.diag(pc) != 0):
            raise TopologyError(f"topology {self.name!r}: a GPU cannot link to itself")
        numa = self.numa or (-1,) * n
        affinity = self.cpu_affinity or ("",) * n
        if len(numa) != n or len(affinity) != n:
            raise TopologyError(f"topology {self.name!r}: NUMA/CPU affinity needs one entry per GPU ({n})")
        nv.flags.writeable = False
        pc.flags.writeable = False
        object.__setattr__(self, "nvlinks", nv)
        object.__setattr__(self, "pcie", pc)
        object.__setattr__(self, "numa", tuple(int(x) for x in numa))
        object.__setattr__(self, "cpu_affinity", tuple(affinity))

    @staticmethod
    def _label(nv: np.ndarray, pc: np.ndarray, i: int, j: int) -> str:
        if i == j:
            return "X"
        return f"NV{nv[i, j]}" if nv[i, j] else _PCIE_ORDER[max(pc[i, j], 1) - 1].value

    # -- per pair -------------------------------------------------------------------------------------

    @property
    def n_gpus(self) -> int:
        return int(self.nvlinks.shape[0])

    def link(self, i: int, j: int) -> LinkType:
        """The best connection between GPUs i and j."""
        if i == j:
            return LinkType.SELF
        if self.nvlinks[i, j]:
            return LinkType.NVSWITCH if self.nvswitch else LinkType.NVLINK
        return self.pcie_link(i, j)

    def pcie_link(self, i: int, j: int) -> LinkType:
        """The PCIe path between GPUs i and j, even when NVLink joins them too (SELF for i == j)."""
        return LinkType.SELF if i == j else _PCIE_ORDER[int(self.pcie[i, j]) - 1]

    def label(self, i: int, j: int) -> str:
        """The ``nvidia-smi topo -m`` cell for (i, j): X, NV12, PIX, …"""
        return self._label(self.nvlinks, self.pcie, i, j)

    def pair_bandwidth_gbps(self) -> np.ndarray:
        """n × n GB/s per direction; the diagonal is inf (a GPU talks to itself through its memory)."""
        m = self.bandwidth_model
        discount = np.array([0.0] + [m.pcie_discount[t] for t in _PCIE_ORDER])
        pcie_gbps = m.pcie_gbps * discount[self.pcie]
        bw = np.where(self.nvlinks > 0, self.nvlinks * m.nvlink_gbps_per_link, pcie_gbps)
        np.fill_diagonal(bw, np.inf)
        return bw

    def hops(self) -> np.ndarray:
        """n × n hop distance under the cost model (0 same GPU, 1 NVLink, 2 NVSwitch, 3 PCIe by default)."""
        c = self.cost_model
        nv_hop = c.nvswitch if self.nvswitch else c.nvlink
        h = np.where(self.nvlinks > 0, nv_hop, c.pcie).astype(float)
        np.fill_diagonal(h, c.same_gpu)
        return h

    # -- per set --------------------------------------------------------------------------------------

    def hop_cost(self, gpus: Sequence[int]) -> float:
        """Sum of hop distances over every pair of the set (a set: repeated GPUs count once)."""
        mask = mask_of(gpus)
        cached = self._hop_cache.get(mask)
        if cached is None:
            idx = np.asarray(_gpus_of(mask), dtype=np.int64)
            cached = self._hop_cache[mask] = float(np.triu(self.hops()[np.ix_(idx, idx)], 1).sum())
        return cached

    def ring_bandwidth(self, gpus: Sequence[int]) -> float:
        """Best bottleneck GB/s of a ring through the set; inf for one GPU (no link is used)."""
        mask = mask_of(gpus)
        cached = self._ring_cache.get(mask)
        if cached is None:
            cached = _best_ring_bottleneck(self.pair_bandwidth_gbps(), _gpus_of(mask))
            self._ring_cache[mask] = cached
        return cached

    def nvlink_groups(self) -> list[tuple[int, ...]]:
        """GPUs joined by NVLink (directly or through NVSwitch), as connected groups; lone GPUs alone."""
        n, seen, groups = self.n_gpus, set(), []
        for start in range(n):
            if start in seen:
                continue
            stack, group = [start], set()
            while stack:
                g = stack.pop()
                if g in group:
                    continue
                group.add(g)
                stack.extend(int(h) for h in np.flatnonzero(self.nvlinks[g]) if h not in group)
            seen |= group
            groups.append(tuple(sorted(group)))
        return groups

    def with_models(self, bandwidth: BandwidthModel | None = None, cost: CostModel | None = None) -> Topology:
        """The same wiring under another bandwidth or cost model."""
        return replace(
            self, bandwidth_model=bandwidth or self.bandwidth_model, cost_model=cost or self.cost_model
        )


def _best_ring_bottleneck(bw: np.ndarray, gpus: tuple[int, ...]) -> float:
    """Largest t such that the pairs with bandwidth ≥ t contain a ring through every GPU of the set.

    Tries each distinct pair bandwidth, best first, and tests for a Hamiltonian cycle with a bitmask DP
    (k ≤ 8 here, so at most 2^8 · 8 states per test).
    """
    k = len(gpus)
    if k < 2:
        return math.inf
    sub = bw[np.ix_(gpus, gpus)]
    if k == 2:
        return float(sub[0, 1])
    for t in sorted({float(x) for x in sub[np.triu_indices(k, 1)]}, reverse=True):
        adj = [sum(1 << v for v in range(k) if v != u and sub[u, v] >= t) for u in range(k)]
        if _has_hamiltonian_cycle(adj, k):
            return t
    return 0.0  # unreachable: at the smallest threshold the pairs form a complete graph


def _has_hamiltonian_cycle(adj: list[int], k: int) -> bool:
    full = (1 << k) - 1
    ends = [0] * (1 << k)  # ends[mask]: vertices v such that a path 0 → … → v visits exactly mask
    ends[1] = 1
    for mask in range(1, full + 1, 2):  # every path starts at vertex 0, so bit 0 is set
        e = ends[mask]
        while e:
            v = (e & -e).bit_length() - 1
            e &= e - 1
            nxt = adj[v] & ~mask
            while nxt:
                u = (nxt & -nxt).bit_length() - 1
                nxt &= nxt - 1
                ends[mask | 1 << u] |= 1 << u
    return bool(ends[full] & adj[0])


def build_topology(
    name: str,
    labels: Sequence[Sequence[str]],
    *,
    pcie_labels: Sequence[Sequence[str]] | None = None,
    nvswitch: bool | None = None,
    numa: Sequence[int] = (),
    cpu_affinity: Sequence[str] = (),
    gpu_model: str = "",
    bandwidth: BandwidthModel | None = None,
    cost: CostModel | None = None,
    source: str = "",
) -> Topology:
    """A topology from an ``nvidia-smi topo -m`` style GPU × GPU label matrix.

    ``pcie_labels`` gives the PCIe path under NVLinked pairs where it is known (DGX-1's PCIe tree,
    go-gpuallocator's ``NewDGX1VoltaNode``). Where it is not, it is inferred from NUMA: same node → NODE,
    different or unknown → SYS (nvidia-smi hides the PCIe path of an NV# pair). ``nvswitch`` None means:
    detect it, true when some GPU's NV# counts sum past ``NVLINK_MAX_LINKS`` (only a switch can fan out that
    many).
    """
    n = len(labels)
    nv = np.zeros((n, n), dtype=np.int64)
    pc = np.zeros((n, n), dtype=np.int64)
    numa_list = list(numa) or [-1] * n
    for i, row in enumerate(labels):
        if len(row) != n:
            raise TopologyError(f"topology {name!r}: row GPU{i} has {len(row)} cells, expected {n}")
        for j, cell in enumerate(row):
            try:
                count, level = parse_link_label(cell)
            except ValueError as err:
                raise TopologyError(f"topology {name!r}: GPU{i}→GPU{j}: {err}") from None
            if (i == j) != (level is LinkType.SELF):
                raise TopologyError(f"topology {name!r}: GPU{i}→GPU{j} is {cell!r}; only the diagonal is X")
            if i == j:
                continue
            nv[i, j] = count
            if level is None:
                level = _under_nvlink(pcie_labels, numa_list, i, j, name)
            pc[i, j] = _PCIE_CODE[level]
    if nvswitch is None:
        nvswitch = bool(n and nv.sum(axis=1).max() > NVLINK_MAX_LINKS)
    return Topology(
        name=name,
        nvlinks=nv,
        pcie=pc,
        nvswitch=nvswitch,
        numa=tuple(numa_list),
        cpu_affinity=tuple(cpu_affinity),
        gpu_model=gpu_model,
        bandwidth_model=bandwidth or BandwidthModel(),
        cost_model=cost or CostModel(),
        source=source,
    )


def _under_nvlink(
    pcie_labels: Sequence[Sequence[str]] | None, numa: list[int], i: int, j: int, name: str
) -> LinkType:
    if pcie_labels is not None:
        _, level = parse_link_label(pcie_labels[i][j])
        if level is None or level is LinkType.SELF:
            raise TopologyError(f"topology {name!r}: PCIe path GPU{i}→GPU{j} must be PIX…SYS")
        return level
    return LinkType.NODE if numa[i] >= 0 and numa[i] == numa[j] else LinkType.SYS
