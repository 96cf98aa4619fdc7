"""Timed replay comparison table: mean/p99 JCT and wait for each queue setup × placement × trace × load.

Usage: .venv/bin/python benchmarks/sim_replay_table.py [--trace-dir /path/to/openb] [--traces default ...]
       [--loads 10000 30000] [--repeat 2] [--placements fgd bestfit] [--jobs 2] [--out benchmarks/out/...]
Traces outside the repository are read from --trace-dir (the bundled folder has only the default trace).
One openb pod list never fills the cluster however much it is compressed, so copies are played back to
back (--repeat) at a high --load for queues to form. Rows are appended to the JSON-lines file as runs end.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from itertools import product
from pathlib import Path

SETUPS = ["fifo", "fair-share", "sjf-oracle", "sjf-predicted", "easy-backfill"]


def run(trace_name: str, trace_dir: str | None, setup_name: str, placement: str, load: float, repeat: int):
    from gpuslice.sim.queue_setups import estimates_for, queue_setup
    from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
    from gpuslice.sim.timed_trace import load_timed_trace, repeat_trace

    trace = repeat_trace(load_timed_trace(trace_name, Path(trace_dir) if trace_dir else None), repeat)
    setup = queue_setup(setup_name)
    config = ReplayConfig(placement, setup.queue, setup.backfill, load, label=setup.name)
    started = time.perf_counter()
    rec = replay_timed(trace, config, estimates_for(trace.jobs, setup)).record()
    jct, wait = rec["jct_s"]["all"], rec["wait_s"]["all"]  # type: ignore[index]
    return {
        "trace": trace_name, "repeat": repeat, "load": load, "queue": setup_name, "placement": placement,
        "pods": rec["pods"], "jct_mean": jct["mean"], "jct_p99": jct["p99"], "wait_mean": wait["mean"],
        "wait_p99": wait["p99"], "preemptions": rec["preemptions"], "never_started": rec["never_started"],
        "wall_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace-dir", default=None)
    parser.add_argument("--traces", nargs="+", default=["default"])
    parser.add_argument("--loads", type=float, nargs="+", default=[30000.0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--placements", nargs="+", default=["fgd", "bestfit"])
    parser.add_argument("--setups", nargs="+", default=SETUPS)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/sim_replay_table.jsonl"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "load_average": os.getloadavg()}), flush=True)
    runs = list(product(args.traces, args.loads, args.placements, args.setups))
    with ProcessPoolExecutor(args.jobs) as pool, args.out.open("a") as out:
        futures = [pool.submit(run, t, args.trace_dir, s, p, load, args.repeat) for t, load, p, s in runs]
        for future in futures:
            row = future.result()
            row["load_average_1m"] = round(os.getloadavg()[0], 1)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
