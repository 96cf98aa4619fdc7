"""Timed replay: speed on the default trace, the 100,000-job stream, peak memory by stream length, cost
by jobs and by nodes, and the offered load a compression factor gives (peak concurrent GPU demand with
unlimited GPUs).

Usage: nice .venv/bin/python benchmarks/sim_replay.py [--repeats 1 4 7 14] [--nodes 1 2 4]
       [--out benchmarks/out/sim_replay.json]
Each measurement runs in a fresh child process, so its peak RSS is its own; each row carries the
1-minute load average before and after it (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

# `--repeat N` is a stream (timed_trace.RepeatedJobs): pods are made as they arrive; NODES copies of
# the node list (names suffixed) give the same jobs a cluster NODES times as large.
CHILD = """
import dataclasses, hashlib, json, resource, sys, time
import numpy as np
from gpuslice.sim.timed_trace import load_timed_trace, repeat_trace
from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
from gpuslice.sim.queue_setups import queue_setup, estimates_for
placement, setup_name, load = sys.argv[1], sys.argv[2], float(sys.argv[3])
repeat, copies = int(sys.argv[4]), int(sys.argv[5])
trace = repeat_trace(load_timed_trace(), repeat)
if copies > 1:
    nodes = tuple(dataclasses.replace(n, name=f"{n.name}~{k}") for k in range(copies) for n in trace.nodes)
    trace = dataclasses.replace(trace, nodes=nodes)
setup = queue_setup(setup_name)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
result = replay_timed(trace, ReplayConfig(placement, setup.queue, setup.backfill, load, label=setup.name),
                      estimates_for(trace.jobs, setup))
wall = time.perf_counter() - started
rec = result.record()
digest = hashlib.sha256()
for a in (result.start, result.end, result.waited, result.preempted.astype(np.int64), result.never_fits):
    digest.update(np.ascontiguousarray(a).tobytes())
print(json.dumps({"placement": placement, "queue": setup_name, "load": load, "repeat": repeat,
                  "node_copies": copies, "nodes": len(trace.nodes), "jobs": rec["pods"],
                  "wall_s": round(wall, 2),
                  "rss_before_replay_mib": round(before / 1024, 1),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "wait_mean_s": rec["wait_s"]["all"]["mean"], "never_started": rec["never_started"],
                  "preemptions": rec["preemptions"], "sha256": digest.hexdigest()[:16]}))
"""


def child(placement: str, setup: str, load: float, repeat: int, copies: int = 1) -> dict[str, object]:
    load_before = round(os.getloadavg()[0], 1)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, placement, setup, str(load), str(repeat), str(copies)],
        check=True,
        capture_output=True,
        text=True,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["load_1min"] = [load_before, round(os.getloadavg()[0], 1)]
    print(row, flush=True)
    return row


def peak_demand(loads: list[float]) -> list[dict[str, float]]:
    """Peak concurrent GPUs the default trace asks for at each compression, with unlimited GPUs."""
    from gpuslice.sim.timed_trace import load_timed_trace
    from offered_load import cluster_gpus, peak_gpus

    trace = load_timed_trace()
    total = cluster_gpus(trace)
    return [
        {"load": load, "peak_gpus": round(peak_gpus(trace, load)), "cluster_gpus": total} for load in loads
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, nargs="+", default=[1, 4, 7, 14])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4], help="copies of the node list")
    parser.add_argument("--node-repeat", type=int, default=4, help="stream length for the node rows")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/sim_replay.json"))
    args = parser.parse_args()
    started = time.time()
    report: dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "load_average": list(os.getloadavg())}
    report["default_fgd_fair_share"] = child("fgd", "fair-share", 1.0, 1)
    report["by_jobs_bestfit_fifo"] = [child("bestfit", "fifo", 1.0, r) for r in args.repeats]
    report["by_nodes_bestfit_fifo"] = [child("bestfit", "fifo", 1.0, args.node_repeat, c) for c in args.nodes]
    report["peak_demand"] = peak_demand([1, 100, 1000, 3000, 10000, 30000, 1e6])
    report["wall_s"] = round(time.time() - started, 1)
    report["self_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["peak_demand"]))


if __name__ == "__main__":
    main()
