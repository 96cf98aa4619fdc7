"""Memory oversubscription sweep (issue 5): every eviction × prefetch pair on every workload at 1.2×,
1.5×, 1.8× — faults normalised to Belady (same prefetch) and estimated speedup over the driver default
(default + tree) — plus simulator throughput per policy. Writes benchmarks/out/memsim.md.

    .venv/bin/python benchmarks/memsim.py --scale 0.1              # the whole grid, small traces
    .venv/bin/python benchmarks/memsim.py --workloads gemm,hotspot  # a subset
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpuslice.memory import EVICTION, PREFETCH, WORKLOADS, SimConfig, make_ops, make_workload, simulate

OVERSUB = (1.2, 1.5, 1.8)


def sweep(workloads: list[str], scale: float) -> list[str]:
    lines = [
        "| workload | oversub | evict | prefetch | faults | faults / Belady | est. s | speedup vs default |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in workloads:
        trace = make_workload(name, scale=scale)
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
    return lines


def throughput(workloads: list[str], scale: float) -> list[str]:
    lines = ["| workload | accesses | policy | accesses/s |", "|---|---|---|---|"]
    for name in workloads:
        trace = make_workload(name, scale=scale)
        for e, p in (("default", "tree"), ("lfu", "stride"), ("belady", "tree"), ("priority", "priority")):
            t0 = time.perf_counter()
            simulate(trace, make_ops(e, p), SimConfig(oversub=1.5))
            rate = len(trace) / (time.perf_counter() - t0)
            lines.append(f"| {name} | {len(trace):,} | {e}+{p} | {rate / 1e6:.2f} M |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.1, help="workload size factor for the grid")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    ap.add_argument("--throughput-scale", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "memsim.md")
    args = ap.parse_args()
    names = args.workloads.split(",")
    body = [
        "# memsim (issue 5)",
        "",
        f"Command: `.venv/bin/python benchmarks/memsim.py --scale {args.scale} --workloads {args.workloads}`",
        "",
        "## Throughput (one core, oversub 1.5×)",
        "",
    ]
    body += throughput(names, args.throughput_scale)
    body += ["", f"## Grid (scale {args.scale})", "", *sweep(names, args.scale)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(body) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
