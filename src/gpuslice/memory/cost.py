"""Estimated runtime of a simulated run: fault-batch service + migrated bytes over the link + compute.

``seconds = accesses × per_access_s + Σ_batches (batch_overhead_s + (migrated + evicted bytes) / link)``

The GPU stalls while a fault batch is serviced (one fault-service thread per GPU, batches of 256, research
§3), so batch times add up. A tenant's time counts its own compute, the overhead of every batch holding
one of its faults, and the bytes moved for its faults (its own pages in, and the chunks its faults evict
out), which is what lets a priority policy shorten one tenant at the other's expense.

Where each constant comes from:

- PCIe Gen4 = 20 480 MB/s: the gpu_ext loaders' PCIe ceiling ``max_bw`` (research §2.2). Gen5 doubles the
  per-lane rate (PCIe 5.0 spec; not in the research note). NVLink-C2C = 450 GB/s per direction (NVIDIA
  Grace Hopper figure; not in the research note).
- ``per_access_s`` = 2.3 ns: one 4 KB page read at ~1.8 TB/s, the memory bandwidth of the RTX 5090 that
  gpu_ext measured on (research §4; the bandwidth figure is NVIDIA's spec, not in the note).
- ``batch_overhead_s`` = 20 µs per fault batch: our assumption (the note gives no service latency); it is a
  parameter. Comparisons between policies that need different numbers of batches depend on it: stride +
  LFU beats the driver on MoE decode below ~1.8 µs and loses above (benchmarks/out/memsim.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.units import MiB

__all__ = ["LINKS", "CostModel"]

LINKS: dict[str, float] = {
    "pcie4": 20_480 * MiB,  # gpu_ext loaders' max_bw 20 480 MB/s (research §2.2)
    "pcie5": 2 * 20_480 * MiB,  # Gen5 doubles the lane rate (ours, from the PCIe spec)
    "nvlink-c2c": 450e9,  # per direction, Grace Hopper (ours, vendor figure)
}


@dataclass(frozen=True)
class CostModel:
    """Link bandwidth (bytes/s), fixed cost per fault batch (s), compute per page access (s)."""

    link: str = "pcie4"
    batch_overhead_s: float = 20e-6
    per_access_s: float = 2.3e-9

    @property
    def link_bytes_per_s(self) -> float:
        return LINKS[self.link]

    def batch_seconds(self, moved_bytes: int) -> float:
        """Service time of one fault batch that moves ``moved_bytes`` over the link (in plus out)."""
        return self.batch_overhead_s + moved_bytes / self.link_bytes_per_s

    def compute_seconds(self, accesses: int) -> float:
        return accesses * self.per_access_s
