"""Estimated runtime of a simulated run: fault-batch service + migrated bytes over the link + compute.

``seconds = accesses × per_access_s + Σ_batches (batch_overhead_s + (migrated + evicted bytes) / link)``

The GPU stalls while a fault batch is serviced (one fault-service thread per GPU, batches of 256 in
uvm_gpu_replayable_faults.c), so batch times add up. A tenant's time counts its own compute, the overhead of
every batch holding one of its faults, and the bytes moved for its faults (its own pages in, and the chunks
its faults evict out), which is what lets a priority policy shorten one tenant at the other's expense.

Where each constant comes from:

- PCIe Gen4 = 20 480 MB/s: the gpu_ext loaders' PCIe ceiling ``max_bw`` (its adaptive prefetch loaders). Gen5
  doubles the per-lane rate (PCI-SIG, PCIe 5.0 specification). NVLink-C2C = 450 GB/s per direction (NVIDIA
  Grace Hopper superchip figure). docs/references.md, "Memory cost model".
- ``per_access_s`` = 2.3 ns: one 4 KB page read at ~1.8 TB/s, the memory bandwidth of the RTX 5090 that
  gpu_ext measured on (gpu_ext ``workloads/README.md``; the bandwidth figure is NVIDIA's RTX 5090 spec).
- ``batch_overhead_s`` = 20 µs per fault batch: our assumption (no public source gives a service latency); it
  is a parameter. Comparisons between policies that need different numbers of batches depend on it: stride +
  LFU beats the driver on MoE decode below ~1.8 µs and loses above (benchmarks/out/memsim.md).

A *cost profile* replaces all three numbers with measured ones: a JSON file read by ``load_cost_profile``
(``gpuslice memsim --cost-profile FILE``), written by ``scripts/gpu-acceptance`` from unified-memory
microbenchmarks on a real GPU. Its format is in docs/cost-profile.md. No measured profile ships yet: the
defaults above are estimates until the script has run on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuslice.errors import UserError
from gpuslice.inputs import InvalidInput, read_json
from gpuslice.units import MiB

__all__ = ["COST_PROFILE_FORMAT", "LINKS", "CostModel", "CostProfileError", "load_cost_profile"]

LINKS: dict[str, float] = {
    "pcie4": 20_480 * MiB,  # gpu_ext loaders' max_bw 20 480 MB/s
    "pcie5": 2 * 20_480 * MiB,  # Gen5 doubles the lane rate (ours, from the PCIe spec)
    "nvlink-c2c": 450e9,  # per direction, Grace Hopper (ours, vendor figure)
}


COST_PROFILE_FORMAT = 1  # the "format" a cost profile file must declare (docs/cost-profile.md)


class CostProfileError(UserError):
    """A cost profile file is missing, not JSON, or has a missing, unknown or out-of-range field."""


@dataclass(frozen=True)
class CostModel:
    """Link bandwidth (bytes/s), fixed cost per fault batch (s), compute per page access (s).

    ``bytes_per_s``: a measured link rate (from a cost profile); when None the rate is ``LINKS[link]``.
    ``name``: where the numbers come from, shown with results ("pcie4" or the profile's name)."""

    link: str = "pcie4"
    batch_overhead_s: float = 20e-6
    per_access_s: float = 2.3e-9
    bytes_per_s: float | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.bytes_per_s is None and self.link not in LINKS:
            raise ValueError(f"unknown link {self.link!r}; known: {', '.join(LINKS)} (or give bytes_per_s)")

    @property
    def link_bytes_per_s(self) -> float:
        return LINKS[self.link] if self.bytes_per_s is None else self.bytes_per_s

    def batch_seconds(self, moved_bytes: int) -> float:
        """Service time of one fault batch that moves ``moved_bytes`` over the link (in plus out)."""
        return self.batch_overhead_s + moved_bytes / self.link_bytes_per_s

    def compute_seconds(self, accesses: int) -> float:
        return accesses * self.per_access_s


# field -> (lowest allowed value, whether the lowest itself is allowed)
_PROFILE_NUMBERS: dict[str, tuple[float, bool]] = {
    "link_bytes_per_s": (0.0, False),
    "batch_overhead_s": (0.0, True),
    "per_access_s": (0.0, True),
}
_PROFILE_OPTIONAL = {"name", "source"}


def _profile_number(path: Path, data: dict[str, Any], key: str) -> float:
    if key not in data:
        raise CostProfileError(f"cost profile {path}: missing field {key!r} (docs/cost-profile.md)")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CostProfileError(f"cost profile {path}: {key} must be a finite number, got {value!r}")
    low, inclusive = _PROFILE_NUMBERS[key]
    if value < low or (value == low and not inclusive):
        rel = ">=" if inclusive else ">"
        raise CostProfileError(f"cost profile {path}: {key} must be {rel} {low:g}, got {value!r}")
    return float(value)


def load_cost_profile(path: Path | str) -> CostModel:
    """The CostModel a cost profile file describes; CostProfileError names the file and the first problem.

    A profile is one JSON object: ``format`` (must be 1), ``link_bytes_per_s`` (> 0), ``batch_overhead_s``
    (>= 0), ``per_access_s`` (>= 0), and optionally ``name`` (text) and ``source`` (an object saying how
    the numbers were obtained; kept, not interpreted). Any other key is refused, so a typo cannot leave a
    default in place unnoticed."""
    path = Path(path)
    try:  # binary, non-UTF-8, empty, not JSON, too deep, a number of thousands of digits: refused
        data = read_json(path, "cost profile")
    except InvalidInput as err:
        raise CostProfileError(str(err)) from None
    if not isinstance(data, dict):
        raise CostProfileError(f"cost profile {path}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != COST_PROFILE_FORMAT:
        raise CostProfileError(
            f"cost profile {path}: 'format' must be {COST_PROFILE_FORMAT}, got {data.get('format')!r}"
        )
    unknown = sorted(set(data) - set(_PROFILE_NUMBERS) - _PROFILE_OPTIONAL - {"format"})
    if unknown:
        known = ", ".join(["format", *_PROFILE_NUMBERS, *sorted(_PROFILE_OPTIONAL)])
        raise CostProfileError(f"cost profile {path}: unknown field {unknown[0]!r}; known: {known}")
    name = data.get("name", path.stem)
    if not isinstance(name, str):
        raise CostProfileError(f"cost profile {path}: name must be text, got {name!r}")
    if not isinstance(data.get("source", {}), dict):
        raise CostProfileError(f"cost profile {path}: source must be a JSON object")
    link, overhead, per_access = (_profile_number(path, data, k) for k in _PROFILE_NUMBERS)
    return CostModel(
        link="profile", batch_overhead_s=overhead, per_access_s=per_access, bytes_per_s=link, name=name
    )
