"""Unified-memory microbenchmarks: the plan, the worker's output parsed, the cost profile, memsim compared.

```text
make_plan(options)           sizes, fault count, sweeps (pattern × ratio, each pass's permutation)
  -> um_worker.py PLAN       on the GPU, one process: one JSON line per measurement (or a canned file)
  -> parse_measurements      validated records; a line that is not a measurement is kept as a note
  -> build_cost_profile      link = H2D prefetch rate, per access = resident sweep time / accesses,
                             batch overhead = serial fault time - the bytes memsim moves for it / link
  -> sweep_trace + memsim    the same sweep as a trace, `gpuslice memsim --trace --cost-profile --json`
  -> compare_sweeps          measured vs predicted seconds per sweep, and the error
```

Oversubscribing managed memory (a sweep larger than the GPU memory left free) can hang the GPU on some
machines, so sweeps above ``SAFE_RATIO`` of the free memory run only with ``allow_oversubscription``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "PAGE",
    "SAFE_RATIO",
    "MeasurementError",
    "Measurements",
    "build_cost_profile",
    "compare_sweeps",
    "make_plan",
    "parse_measurements",
    "planned_sweep",
    "sweep_trace",
]

PAGE = 4096
BLOCK = 2 << 20
PAGES_PER_BLOCK = BLOCK // PAGE
SAFE_RATIO = 0.9  # a sweep up to this share of the free GPU memory never oversubscribes
FULL_RATIOS = (1.0, 1.25, 1.5, 1.75, 2.0)
SAFE_RATIOS = (0.25, 0.5, 0.75, 0.85)
MIB = 1 << 20
DEFAULT_CAPACITY = 512 * MIB


class MeasurementError(ValueError):
    """The worker's output lacks a measurement the profile needs, or one is malformed."""


def _coprime_step(rng: np.random.Generator, tile: int) -> int:
    """An odd step with gcd(step, tile) = 1, so k -> (k * step + offset) % tile visits every page once."""
    if tile <= 2:
        return 1
    step = int(rng.integers(0, tile // 2)) * 2 + 1
    while math.gcd(step, tile) != 1:
        step += 2
    return step % tile or 1


def make_plan(
    capacity_bytes: int = DEFAULT_CAPACITY,
    bench_bytes: int = 512 * MIB,
    fault_pages: int = 512,
    streams: int = 256,
    passes: int = 2,
    allow_oversubscription: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """What the worker measures. Sweeps are sized against ``capacity_bytes``, the managed memory the
    worker leaves free on the GPU (it fills the rest with plain allocations first)."""
    rng = np.random.default_rng(seed)
    ratios = FULL_RATIOS if allow_oversubscription else SAFE_RATIOS
    sweeps = []
    for pattern in ("cyclic", "random"):
        for ratio in ratios:
            tile = max(1, round(ratio * capacity_bytes / PAGE / streams))
            orders = [
                {"step": _coprime_step(rng, tile), "offset": int(rng.integers(0, tile))}
                if pattern == "random"
                else {"step": 1, "offset": 0}
                for _ in range(passes)
            ]
            sweeps.append(
                {"pattern": pattern, "ratio": ratio, "streams": streams, "tile": tile, "passes": orders}
            )
    return {
        "capacity_bytes": capacity_bytes,
        "bench_bytes": bench_bytes,
        "fault_pages": fault_pages,
        "streams": streams,
        "allow_oversubscription": allow_oversubscription,
        "safe_ratio": SAFE_RATIO,
        "sweeps": sweeps,
    }


@dataclass
class Measurements:
    """The worker's records by kind; ``notes`` are its other output lines (warnings, errors)."""

    env: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] | None = None
    bandwidth: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (direction, method)
    advise: dict[str, dict[str, Any]] = field(default_factory=dict)
    resident: dict[str, Any] | None = None
    sweeps: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "fault_batch": self.faults,
            "bandwidth": {f"{d} {m}": v for (d, m), v in self.bandwidth.items()},
            "advise": self.advise,
            "resident_sweep": self.resident,
            "sweeps": self.sweeps,
            "errors": self.errors,
            "notes": self.notes[:20],
        }


_REQUIRED: dict[str, tuple[str, ...]] = {
    "env": (),
    "faults": ("pages", "seconds"),
    "bandwidth": ("direction", "method", "bytes", "seconds"),
    "advise": ("variant", "bytes", "seconds"),
    "resident": ("accesses", "seconds"),
    "sweep": ("pattern", "ratio", "tile", "streams", "buffer_bytes", "capacity_bytes", "pass_seconds"),
    "error": ("step", "message"),
}


def _positive(record: dict[str, Any], key: str) -> None:
    value = record[key]
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 for v in values):
        raise MeasurementError(f"{record['kind']}: {key} must be positive numbers, got {value!r}")


def parse_measurements(text: str) -> Measurements:
    """The worker's stdout: one JSON object per line with a ``kind``; other lines become notes."""
    m = Measurements()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            m.notes.append(line[:300])
            continue
        if not isinstance(record, dict) or record.get("kind") not in _REQUIRED:
            m.notes.append(line[:300])
            continue
        kind = record["kind"]
        missing = [k for k in _REQUIRED[kind] if k not in record]
        if missing:
            raise MeasurementError(f"{kind} record lacks {', '.join(missing)}: {line[:200]}")
        for key in (
            "seconds",
            "bytes",
            "pages",
            "accesses",
            "buffer_bytes",
            "capacity_bytes",
            "pass_seconds",
        ):
            if key in record and key in _REQUIRED[kind]:
                _positive(record, key)
        if kind == "env":
            m.env = record
        elif kind == "faults":
            m.faults = record
        elif kind == "bandwidth":
            m.bandwidth[(record["direction"], record["method"])] = record
        elif kind == "advise":
            m.advise[record["variant"]] = record
        elif kind == "resident":
            m.resident = record
        elif kind == "sweep":
            m.sweeps.append(record)
        else:
            m.errors.append(record)
    return m


def rate(record: dict[str, Any]) -> float:
    """Bytes per second of a bandwidth or advise record."""
    return record["bytes"] / record["seconds"]


def serial_fault_trace(pages: int):
    """The worker's serial-fault kernel as a trace: one thread touches page 0 of ``pages`` 2 MB blocks,
    one after the other (each access its own step, so each fault is its own batch)."""
    from gpuslice.memory.workloads import Trace

    n = np.arange(pages)
    return Trace.from_columns(
        "serial-faults", np.zeros(pages), n, np.zeros(pages), np.zeros(pages), n, np.zeros(pages)
    )


def build_cost_profile(m: Measurements, *, name: str, source: dict[str, Any]) -> dict[str, Any]:
    """A cost profile (docs/cost-profile.md) from measurements:

    - ``link_bytes_per_s``: host-to-device ``cudaMemPrefetchAsync`` rate, the link's bulk rate. Evictions
      are charged at the same rate (the simulator has one); the device-to-host rate is in ``source``.
    - ``per_access_s``: the cyclic sweep over a buffer already resident on the GPU, seconds / accesses.
    - ``batch_overhead_s``: one serial fault's time less the transfer memsim charges for that same fault
      (its migrated bytes / link), so that memsim replaying the serial-fault kernel gives its measured time.
    """
    from gpuslice.memory import SimConfig, simulate
    from gpuslice.memory.cost import CostModel
    from gpuslice.programs.loader import memory_ops

    if m.faults is None or m.resident is None or ("h2d", "prefetch") not in m.bandwidth:
        have = [k for k, v in (("faults", m.faults), ("resident", m.resident)) if v is not None]
        have += [f"bandwidth {d} {meth}" for d, meth in m.bandwidth]
        raise MeasurementError(
            "a profile needs the serial-fault, resident-sweep and h2d prefetch measurements; have: "
            + (", ".join(have) or "none")
        )
    link = rate(m.bandwidth[("h2d", "prefetch")])
    per_access = m.resident["seconds"] / m.resident["accesses"]
    pages = int(m.faults["pages"])
    fault_s = m.faults["seconds"] / pages
    sim = simulate(
        serial_fault_trace(pages),
        memory_ops("default", "tree"),
        SimConfig(
            oversub=1.0,
            cost=CostModel(link="measured", bytes_per_s=link, batch_overhead_s=0.0, per_access_s=0.0),
        ),
        "default",
        "tree",
    )
    moved_per_fault = (sim.migrated_bytes + sim.evicted_bytes) / max(1, sim.batches)
    overhead = max(0.0, fault_s - moved_per_fault / link)
    figures = {
        "serial_fault_us": fault_s * 1e6,
        "memsim_bytes_per_serial_fault": moved_per_fault,
        **{f"{d}_{meth}_gb_per_s": rate(r) / 1e9 for (d, meth), r in sorted(m.bandwidth.items())},
        "resident_ns_per_access": per_access * 1e9,
    }
    return {
        "format": 1,
        "name": name,
        "link_bytes_per_s": link,
        "batch_overhead_s": overhead,
        "per_access_s": per_access,
        "source": {**source, "figures": figures},
    }


def planned_sweep(plan_sweeps: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
    """The planned sweep a measured one ran (its passes' permutations are in the plan only); the
    measurement must have the plan's shape and one time per planned pass."""
    for s in plan_sweeps:
        if (s["pattern"], float(s["ratio"])) == (measured["pattern"], float(measured["ratio"])):
            shape = (int(measured["tile"]), int(measured["streams"]), len(measured["pass_seconds"]))
            if shape != (int(s["tile"]), int(s["streams"]), len(s["passes"])):
                raise MeasurementError(
                    f"sweep {s['pattern']} {s['ratio']}: measured tile, streams, passes {shape} differ from "
                    f"the plan's {(s['tile'], s['streams'], len(s['passes']))}"
                )
            return s
    raise MeasurementError(f"sweep {measured['pattern']} {measured['ratio']} is not in the plan")


def sweep_trace(sweep: dict[str, Any]):
    """The worker's sweep kernel as a memsim trace: ``streams`` threads each own ``tile`` pages; per pass
    every thread visits its tile one page per step, in order (cyclic) or as ``(k·step + offset) % tile``
    (random). Each pass is one kernel launch: new stream ids, and it starts after the previous one."""
    from gpuslice.memory.workloads import Trace

    streams, tile = int(sweep["streams"]), int(sweep["tile"])
    k = np.arange(tile)
    cols = np.arange(streams)
    pages, times, ids = [], [], []
    for p, order in enumerate(sweep["passes"]):
        within = (k * int(order["step"]) + int(order["offset"])) % tile
        grid = cols[None, :] * tile + within[:, None]  # rows = steps, columns = threads
        pages.append(grid.ravel())
        times.append(np.repeat(p * tile + k, streams))
        ids.append(np.tile(p * streams + cols, tile))
    gp = np.concatenate(pages)
    name = f"{sweep['pattern']}-sweep-{sweep['ratio']}"
    return Trace.from_columns(
        name,
        np.zeros(len(gp)),
        gp // PAGES_PER_BLOCK,
        gp % PAGES_PER_BLOCK,
        np.zeros(len(gp)),
        np.concatenate(times),
        np.concatenate(ids),
    )


def memsim_oversub(trace_blocks: int, capacity_bytes: int) -> float:
    """The ``--oversub`` giving memsim ``capacity_bytes`` // 2 MB chunks for this trace (1.0 if it fits)."""
    chunks = max(1, capacity_bytes // BLOCK)
    return max(1.0, trace_blocks / chunks)


def compare_sweeps(measured: list[dict[str, Any]], predicted: dict[tuple[str, float], float]) -> list[dict]:
    """One row per measured sweep: measured seconds (sum of passes), memsim's, and the relative error."""
    rows = []
    for s in measured:
        seconds = float(sum(s["pass_seconds"]))
        sim = predicted.get((s["pattern"], float(s["ratio"])))
        rows.append(
            {
                "pattern": s["pattern"],
                "ratio": s["ratio"],
                "oversub": s["buffer_bytes"] / s["capacity_bytes"],
                "measured_s": seconds,
                "memsim_s": sim,
                "error": None if sim is None else (sim - seconds) / seconds,
            }
        )
    return rows


def load_plan(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
