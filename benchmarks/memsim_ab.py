"""Simulator throughput before and after a change: for each workload, a git revision's memory
engine and the working tree's, each in a fresh process, one after the other, so both see the same machine
load. Accesses per CPU second (``time.process_time``), best of ``--repeat``, scale 1, oversub 1.5×; the
compiled driver default is loaded before timing. Tier-0 traces are measured both ways (per-stream and
lockstep) where the code has streams.

    .venv/bin/python benchmarks/memsim_ab.py --before 588de40 > benchmarks/out/memsim_ab.md
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIRS = (("default", "tree"), ("lfu", "tree"), ("belady", "tree"))


def measure(name: str, repeat: int) -> dict:
    """Worker: this process's gpuslice (whichever ``sys.path`` found) on one workload."""
    from gpuslice.memory import SimConfig, make_ops, make_workload, simulate

    simulate(make_workload("gemm", scale=0.05), make_ops(), SimConfig())  # load compiled code, if any
    trace = make_workload(name, scale=1.0)
    has_streams = "stream_progress" in inspect.signature(SimConfig).parameters
    modes = (True, False) if has_streams and getattr(trace, "stream", None) is not None else (None,)
    out = {}
    for e, p in PAIRS:
        for streams in modes:
            kw = {} if streams is None else {"stream_progress": streams}
            best = float("inf")
            for _ in range(repeat):
                c0 = time.process_time()
                simulate(trace, make_ops(e, p), SimConfig(oversub=1.5, **kw))
                best = min(best, time.process_time() - c0)
            key = f"{e}+{p}" + ("" if streams is None else (" streams" if streams else " lockstep"))
            out[key] = len(trace) / best / 1e6
    return {"accesses": len(trace), "load": os.getloadavg()[0], "rates": out}


def run_worker(src: Path, name: str, repeat: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    cmd = [sys.executable, __file__, "--worker", name, "--repeat", str(repeat)]
    return json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="HEAD", help="git revision to compare the working tree with")
    ap.add_argument("--workloads", default=None, help="comma-separated subset (default: all)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker, args.repeat)))
        return
    from gpuslice.memory import WORKLOADS

    names = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    cols = [f"{e} + {p}" for e, p in PAIRS]
    print(
        f"Command: `.venv/bin/python benchmarks/memsim_ab.py --before {args.before} --repeat {args.repeat}`"
    )
    print(
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; M accesses / CPU s; "
        "tier-0 after: per-stream, lockstep)"
    )
    print()
    print(
        "| workload | accesses | "
        + " | ".join(f"{c} before | after" for c in cols)
        + " | load before / after |"
    )
    print("|---|---|" + "---|---|" * len(cols) + "---|")
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.before, "src"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        for name in names:
            before = run_worker(Path(tmp) / "src", name, args.repeat)
            after = run_worker(ROOT / "src", name, args.repeat)
            cells = []
            for e, p in PAIRS:
                key = f"{e}+{p}"
                b = before["rates"].get(key, before["rates"].get(f"{key} lockstep"))
                if key in after["rates"]:
                    a = f"{after['rates'][key]:.2f}"
                else:
                    a = f"{after['rates'][key + ' streams']:.2f}, {after['rates'][key + ' lockstep']:.2f}"
                cells.append(f"{b:.2f} | {a}")
            print(
                f"| {name} | {after['accesses']:,} | "
                + " | ".join(cells)
                + f" | {before['load']:.1f} / {after['load']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
