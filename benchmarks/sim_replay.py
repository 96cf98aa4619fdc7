"""Timed replay: speed on the default trace, growth with jobs, peak memory, and the offered load a
compression factor gives (peak concurrent GPU demand with unlimited GPUs).

Usage: .venv/bin/python benchmarks/sim_replay.py [--repeats 1 2 4 14] [--out benchmarks/out/sim_replay.json]
Each measurement runs in a fresh child process, so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import json, resource, sys, time
from gpuslice.sim.timed_trace import load_timed_trace, repeat_trace
from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
from gpuslice.sim.queue_setups import queue_setup, estimates_for
placement, setup_name, load, repeat = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
trace = repeat_trace(load_timed_trace(), repeat)
setup = queue_setup(setup_name)
started = time.perf_counter()
result = replay_timed(trace, ReplayConfig(placement, setup.queue, setup.backfill, load, label=setup.name),
                      estimates_for(trace.jobs, setup))
wall = time.perf_counter() - started
rec = result.record()
print(json.dumps({"placement": placement, "queue": setup_name, "load": load, "repeat": repeat,
                  "jobs": rec["pods"], "wall_s": round(wall, 2),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "wait_mean_s": rec["wait_s"]["all"]["mean"], "never_started": rec["never_started"]}))
"""


def child(placement: str, setup: str, load: float, repeat: int) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, placement, setup, str(load), str(repeat)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--repeats", type=int, nargs="+", default=[1, 2, 4, 14])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/sim_replay.json"))
    args = parser.parse_args()
    started = time.time()
    report: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d"),
        "load_average": list(__import__("os").getloadavg()),
    }
    report["default_fgd_fair_share"] = child("fgd", "fair-share", 1.0, 1)
    print(report["default_fgd_fair_share"], flush=True)
    report["growth_bestfit_fifo"] = []
    for repeat in args.repeats:
        row = child("bestfit", "fifo", 1.0, repeat)
        print(row, flush=True)
        report["growth_bestfit_fifo"].append(row)  # type: ignore[union-attr]
    report["peak_demand"] = peak_demand([1, 100, 1000, 3000, 10000, 30000, 1e6])
    report["wall_s"] = round(time.time() - started, 1)
    report["self_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["peak_demand"]))


if __name__ == "__main__":
    main()
