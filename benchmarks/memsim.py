"""Memory oversubscription sweep (issue 5): every eviction × prefetch pair on every workload at 1.2×,
1.5×, 1.8× — faults normalised to Belady (same prefetch) and estimated speedup over the driver default
(default + tree) — and simulator throughput per policy. Writes benchmarks/out/memsim.md (grid) and
benchmarks/out/memsim_speed.md (throughput).

    .venv/bin/python benchmarks/memsim.py --scale 0.1               # the whole grid, small traces
    .venv/bin/python benchmarks/memsim.py --workloads gemm,hotspot  # a subset
    .venv/bin/python benchmarks/memsim.py --throughput              # accesses/s per policy, scale 1

Throughput is accesses / CPU seconds of the simulating process (``time.process_time``), so other work on
a shared machine does not count against it; wall seconds are shown next to it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpuslice.memory import EVICTION, PREFETCH, WORKLOADS, SimConfig, make_ops, make_workload, simulate

OVERSUB = (1.2, 1.5, 1.8)
OUT = Path(__file__).parent / "out"


def sweep(workloads: list[str], scale: float) -> list[str]:
    lines = [
        "| workload | oversub | evict | prefetch | faults | faults / Belady | est. s | speedup vs default |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in workloads:
        trace = make_workload(name, scale=scale)
        t0 = time.perf_counter()
        for ov in OVERSUB:
            cfg = SimConfig(oversub=ov)
            base = simulate(trace, make_ops("default", "tree"), cfg)
            for p in PREFETCH:
                bound = simulate(trace, make_ops("belady", p), cfg)
                for e in EVICTION:
                    r = bound if e == "belady" else simulate(trace, make_ops(e, p), cfg)
                    lines.append(
                        f"| {name} | {ov} | {e} | {p} | {r.faults} | {r.faults / max(1, bound.faults):.2f} "
                        f"| {r.estimated_seconds:.4f} | {base.estimated_seconds / r.estimated_seconds:.2f} |"
                    )
        print(f"{name}: {len(trace):,} accesses, grid in {time.perf_counter() - t0:.1f} s", flush=True)
    return lines


def pairs() -> list[tuple[str, str]]:
    """Every eviction policy with the driver tree, and every prefetch policy with driver eviction."""
    return [(e, "tree") for e in EVICTION] + [("default", p) for p in PREFETCH if p != "tree"]


def throughput(workloads: list[str], scale: float) -> list[str]:
    lines = [
        "| workload | accesses | batches | evict | prefetch | M accesses / CPU s | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in workloads:
        trace = make_workload(name, scale=scale)
        for e, p in pairs():
            c0, w0 = time.process_time(), time.perf_counter()
            r = simulate(trace, make_ops(e, p), SimConfig(oversub=1.5))
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            lines.append(
                f"| {name} | {len(trace):,} | {r.batches:,} | {e} | {p} | {len(trace) / cpu / 1e6:.2f} "
                f"| {wall:.2f} |"
            )
        print(f"{name}: done", flush=True)
        print("\n".join(lines[-len(pairs()) :]), flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.1, help="workload size factor for the grid")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    ap.add_argument("--throughput", action="store_true", help="measure accesses/s per policy instead")
    ap.add_argument("--throughput-scale", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=None, help="default: out/memsim.md or out/memsim_speed.md")
    args = ap.parse_args()
    names = args.workloads.split(",")
    if args.throughput:
        out = args.out or OUT / "memsim_speed.md"
        cmd = f"benchmarks/memsim.py --throughput --throughput-scale {args.throughput_scale}"
        title = f"Throughput (one process, oversub 1.5×, scale {args.throughput_scale})"
        rows = throughput(names, args.throughput_scale)
    else:
        out = args.out or OUT / "memsim.md"
        cmd = f"benchmarks/memsim.py --scale {args.scale}"
        title = f"Grid (scale {args.scale})"
        rows = sweep(names, args.scale)
    if args.workloads != ",".join(WORKLOADS):
        cmd += f" --workloads {args.workloads}"
    body = [f"## {title}", "", f"Command: `.venv/bin/python {cmd}`", "", *rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(body) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
