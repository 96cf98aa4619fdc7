"""MIG in sim: what placing MIG pods costs, by cluster size, in the static openb replay and the timed one.

    nice .venv/bin/python benchmarks/sim_mig.py [--nodes 100 400 1600] [--pods 8000]

A synthetic cluster of A100-80GB nodes (8 GPUs; every other node has its first four GPUs in MIG mode)
and a pod list in openb's format: 35 % ask for a MIG instance (1g.10gb … 7g.80gb), the rest shares
and whole GPUs, arriving every few seconds with run times of minutes to hours. The same pods are also
replayed with every MIG pod turned into a share of the same compute (slices / 7) on a cluster without
MIG, so the difference is what the MIG path costs. Per row: wall seconds of one `sim openb` run (FGD,
seed 42, every pod placed once) and of one `sim replay` (fair-share, load = nodes / 20, which keeps the
cluster about full so that a queue forms at every size), and the
microseconds per MIG decision (the difference over the MIG pods). Each run in this process, one after
the other; the 1-minute load average is printed with each row (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from gpuslice.sim.openb import replay
from gpuslice.sim.queue_setups import estimates_for, queue_setup
from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
from gpuslice.sim.timed_trace import load_timed_trace
from gpuslice.sim.trace import NODE_FILE, load_trace

PROFILES = (("1g.10gb", 8), ("1g.20gb", 3), ("2g.20gb", 4), ("3g.40gb", 3), ("4g.40gb", 1), ("7g.80gb", 1))
SLICES = {"1g.10gb": 1, "1g.20gb": 1, "2g.20gb": 2, "3g.40gb": 3, "4g.40gb": 4, "7g.80gb": 7}
HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time,mig_profile"
)


def write(folder: Path, nodes: int, pods: int, mig: bool) -> None:
    """The trace; ``mig`` False: no MIG GPUs, and each MIG pod a share of its compute slices / 7."""
    rng = random.Random(7)
    rows = ["sn,cpu_milli,memory_mib,gpu,model,mig_gpus"]
    rows += [f"n{i:05d},128000,1048576,8,A100-80GB,{4 if mig and i % 2 == 0 else 0}" for i in range(nodes)]
    (folder / NODE_FILE).write_text("\n".join(rows) + "\n")
    lines, t = [HEADER], 0
    for i in range(pods):
        t += int(rng.expovariate(1 / 20))
        duration = int(rng.lognormvariate(7.5, 1.2)) + 30
        qos = rng.choices(["LS", "Burstable", "BE"], [3, 5, 2])[0]
        kind, profile = rng.random(), ""
        if kind < 0.35:
            name = rng.choices([p for p, _ in PROFILES], [w for _, w in PROFILES])[0]
            num_gpu, milli = 1, (0 if mig else SLICES[name] * 1000 // 7)
            profile = name if mig else ""
        elif kind < 0.75:
            num_gpu, milli = 1, rng.choice([100, 200, 250, 500, 700])
        else:
            num_gpu, milli = rng.choices([1, 2, 4, 8], [5, 3, 2, 1])[0], 1000
        lines.append(f"p{i},4000,16384,{num_gpu},{milli},,{qos},Running,{t},{t + duration},{t},{profile}")
    (folder / "openb_pod_list_bench.csv").write_text("\n".join(lines) + "\n")


def timed(folder: Path, load: float) -> tuple[float, float, int]:
    """(openb wall s, replay wall s at ``load``, MIG pods) of the trace in ``folder``."""
    trace = load_trace("bench", folder)
    mig_pods = sum(1 for p in trace.pods if p.request.mig_profile)
    started = time.perf_counter()
    replay(trace, "fgd", seed=42, tune=1.0)
    static = time.perf_counter() - started
    timed_trace = load_timed_trace("bench", folder)
    setup = queue_setup("fair-share")
    config = ReplayConfig("bestfit", setup.queue, setup.backfill, load, label=setup.name)
    started = time.perf_counter()
    replay_timed(timed_trace, config, estimates_for(timed_trace.jobs, setup))
    return static, time.perf_counter() - started, mig_pods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 400, 1600])
    parser.add_argument("--pods", type=int, default=8000)
    args = parser.parse_args()
    print(f"# sim MIG cost, {date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}, {args.pods} pods")  # fmt: skip
    print("| nodes | MIG GPUs | MIG pods | openb s (MIG / shares) | replay s (MIG / shares) "
          "| µs per MIG decision, openb / replay | load |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for nodes in args.nodes:
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            write(Path(a), nodes, args.pods, mig=True)
            write(Path(b), nodes, args.pods, mig=False)
            static_mig, timed_mig, mig_pods = timed(Path(a), nodes / 20)
            static_plain, timed_plain, _ = timed(Path(b), nodes / 20)
        per_static = 1e6 * (static_mig - static_plain) / mig_pods
        per_timed = 1e6 * (timed_mig - timed_plain) / mig_pods
        print(f"| {nodes:,} | {nodes // 2 * 4:,} | {mig_pods:,} | {static_mig:.2f} / {static_plain:.2f} "
              f"| {timed_mig:.2f} / {timed_plain:.2f} | {per_static:,.0f} / {per_timed:,.0f} "
              f"| {os.getloadavg()[0]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
