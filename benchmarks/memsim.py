"""Memory oversubscription sweep: every eviction × prefetch pair on every workload at 1.2×,
1.5×, 1.8× — faults normalised to Belady (same prefetch) and estimated speedup over the driver default
(default + tree) — and simulator throughput per policy. Writes benchmarks/out/memsim.md (grid) and
benchmarks/out/memsim_speed.md (throughput).

    .venv/bin/python benchmarks/memsim.py --scale 0.1               # the whole grid, small traces
    .venv/bin/python benchmarks/memsim.py --workloads gemm,hotspot  # a subset
    .venv/bin/python benchmarks/memsim.py --throughput              # accesses/s per policy, scale 1
    .venv/bin/python benchmarks/memsim.py --throughput --pairs default+tree,lfu+tree,belady+tree

Throughput is accesses / CPU seconds of the simulating process (``time.process_time``), the best of
``--repeat`` runs, so other work on a shared machine does not count against it; wall seconds are shown
next to it. The driver default runs compiled (numba): its one-time cost per process — compiling into an
empty cache, or loading the cached machine code — is measured in fresh subprocesses and reported apart.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuslice.memory import EVICTION, PREFETCH, WORKLOADS, SimConfig, make_ops, make_workload, simulate

OVERSUB = (1.2, 1.5, 1.8)
OUT = Path(__file__).parent / "out"


def sweep(workloads: list[str], scale: float, streams: bool = True) -> list[str]:
    lines = [
        "| workload | oversub | evict | prefetch | faults | faults / Belady | est. s | speedup vs default |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in workloads:
        trace = make_workload(name, scale=scale)
        t0 = time.perf_counter()
        for ov in OVERSUB:
            cfg = SimConfig(oversub=ov, stream_progress=streams)
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


_FIRST_CALL = (
    "import time; c = time.process_time(); "
    "from gpuslice.memory import SimConfig, make_ops, make_workload, simulate; "
    "simulate(make_workload('gemm', scale=0.05), make_ops(), SimConfig()); "
    "print(time.process_time() - c)"
)


def first_call_seconds(cold: bool) -> float:
    """CPU seconds of a fresh process's first compiled replay (imports included): into an empty numba
    cache (``cold``: the compile time) or from the cache the runs below use."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        if cold:
            env["NUMBA_CACHE_DIR"] = tmp
        out = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True)
    return float(out.stdout.strip())


def throughput(
    workloads: list[str], scale: float, chosen: list[tuple[str, str]], repeat: int, streams: bool = True
) -> list[str]:
    cold, warm = first_call_seconds(cold=True), first_call_seconds(cold=False)
    simulate(make_workload("gemm", scale=0.05), make_ops(), SimConfig())  # load the compiled code here too
    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        f"One-time cost per process of the compiled driver default (CPU s, imports included): "
        f"{cold:.1f} s compiling into an empty numba cache, {warm:.1f} s loading the cache; "
        "not counted below.",
        "",
        "| workload | accesses | batches | chunk faults | evict | prefetch | M accesses / CPU s | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in workloads:
        trace = make_workload(name, scale=scale)
        for e, p in chosen:
            best_cpu = best_wall = float("inf")
            for _ in range(repeat):
                c0, w0 = time.process_time(), time.perf_counter()
                r = simulate(trace, make_ops(e, p), SimConfig(oversub=1.5, stream_progress=streams))
                best_cpu = min(best_cpu, time.process_time() - c0)
                best_wall = min(best_wall, time.perf_counter() - w0)
            lines.append(
                f"| {name} | {len(trace):,} | {r.batches:,} | {r.chunk_faults:,} | {e} | {p} "
                f"| {len(trace) / best_cpu / 1e6:.2f} | {best_wall:.3f} |"
            )
        print("\n".join(lines[-len(chosen) :]), flush=True)
    lines.append("")
    lines.append(f"Load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.1, help="workload size factor for the grid")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    ap.add_argument("--throughput", action="store_true", help="measure accesses/s per policy instead")
    ap.add_argument("--throughput-scale", type=float, default=1.0)
    ap.add_argument(
        "--pairs",
        default=None,
        help="throughput: evict+prefetch pairs, e.g. default+tree,lfu+tree (default: all)",
    )
    ap.add_argument("--repeat", type=int, default=3, help="throughput: best of this many runs")
    ap.add_argument(
        "--lockstep", action="store_true", help="replay stream traces in lockstep (the model before streams)"
    )
    ap.add_argument("--out", type=Path, default=None, help="default: out/memsim.md or out/memsim_speed.md")
    args = ap.parse_args()
    names = args.workloads.split(",")
    if args.throughput:
        out = args.out or OUT / "memsim_speed.md"
        cmd = f"benchmarks/memsim.py --throughput --throughput-scale {args.throughput_scale}"
        title = f"Throughput (one process, oversub 1.5×, scale {args.throughput_scale})"
        chosen = [tuple(p.split("+", 1)) for p in args.pairs.split(",")] if args.pairs else pairs()
        if args.pairs:
            cmd += f" --pairs {args.pairs}"
        cmd += f" --repeat {args.repeat}"
        rows = throughput(names, args.throughput_scale, chosen, args.repeat, not args.lockstep)
    else:
        out = args.out or OUT / "memsim.md"
        cmd = f"benchmarks/memsim.py --scale {args.scale}"
        title = f"Grid (scale {args.scale})"
        rows = sweep(names, args.scale, not args.lockstep)
    if args.lockstep:
        cmd += " --lockstep"
    if args.workloads != ",".join(WORKLOADS):
        cmd += f" --workloads {args.workloads}"
    body = [f"## {title}", "", f"Command: `.venv/bin/python {cmd}`", "", *rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(body) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
