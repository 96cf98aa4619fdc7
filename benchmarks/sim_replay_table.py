"""Timed replay comparison table: mean/p99 JCT and wait for each queue setup × placement × trace × load.

Usage: .venv/bin/python benchmarks/sim_replay_table.py [--trace-dir /path/to/openb] [--traces default ...]
       [--node-stride 10 --window 1] [--offered light=0.5 medium=1.2 heavy=2.5 | --loads 30000 --repeat 2]
       [--placements fgd bestfit] [--setups ...] [--jobs 2] [--out benchmarks/out/...]
Traces outside the repository are read from --trace-dir (the bundled folder has only the default trace).

Scaled cluster (``--node-stride K``): every K-th node of the trace's node list with the matching share of
its pods, window ``--window`` of len(pods) // K pods by arrival (``sim.tune.tuning_trace``, arrivals
shifted to start at 0). ``--node-stride 1`` replays the whole trace.

Load: ``--offered NAME=RATIO`` picks, per trace, the fewest back-to-back copies and the least arrival
compression whose peak GPU demand (every pod started on arrival, unlimited GPUs) is RATIO × the cluster's
GPUs (``offered_load.py``); ``--loads``/``--repeat`` give the compression and copies directly.

SJF-predicted's run times are cross-fitted on one copy and the same estimate is given to every copy of a
pod, so a pod's estimate never comes from a model trained on its own copy. Rows are appended to the
JSON-lines file as runs end; a run whose key is already there is skipped (an interrupted table resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from pathlib import Path

# scikit-learn's OpenMP threads on a shared 2-core machine made one model fit 10x slower (55 s vs 5 s)
os.environ.setdefault("OMP_NUM_THREADS", "1")

SETUPS = ["fifo", "fair-share", "sjf-oracle", "sjf-predicted", "easy-backfill"]
KEY = ("trace", "node_stride", "window", "repeat", "load", "queue", "placement")


@dataclass(frozen=True)
class Scale:
    trace_dir: str | None
    node_stride: int
    window: int


@lru_cache(maxsize=8)
def base_trace(name: str, scale: Scale):  # -> TimedTrace
    from gpuslice.sim.timed_trace import load_timed_trace
    from gpuslice.sim.tune import tuning_trace

    directory = Path(scale.trace_dir) if scale.trace_dir else None
    if scale.node_stride == 1:
        return load_timed_trace(name, directory)
    sample = len(load_timed_trace(name, directory).jobs) // scale.node_stride
    return tuning_trace(f"{name}@{scale.window}", sample, scale.node_stride, directory)


def copy_estimates(base_jobs, setup, repeat: int):  # -> np.ndarray, one per pod of repeat_trace(base)
    """Each pod's declared run time for ``repeat`` back-to-back copies: the estimates of one copy, the same
    for every copy of a pod (cross-fitting the repeated trace would train on a pod's own copy)."""
    import numpy as np

    from gpuslice.sim.queue_setups import estimates_for

    return np.tile(estimates_for(base_jobs, setup), repeat)


def run(trace_name: str, scale: Scale, setup_name: str, placement: str, load: float, repeat: int):
    from gpuslice.sim.queue_setups import queue_setup
    from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
    from gpuslice.sim.timed_trace import repeat_trace

    base = base_trace(trace_name, scale)
    trace = repeat_trace(base, repeat)
    setup = queue_setup(setup_name)
    estimates = copy_estimates(base.jobs, setup, repeat)
    config = ReplayConfig(placement, setup.queue, setup.backfill, load, label=setup.name)
    started = time.perf_counter()
    rec = replay_timed(trace, config, estimates).record()
    jct, wait = rec["jct_s"]["all"], rec["wait_s"]["all"]  # type: ignore[index]
    return {
        "trace": trace_name, "node_stride": scale.node_stride, "window": scale.window, "repeat": repeat,
        "load": load, "queue": setup_name, "placement": placement, "pods": rec["pods"],
        "jct_mean": jct["mean"], "jct_p99": jct["p99"], "wait_mean": wait["mean"], "wait_p99": wait["p99"],
        "preemptions": rec["preemptions"], "never_started": rec["never_started"],
        "wall_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def describe(trace_name: str, scale: Scale, level: str, ratio: float | None, repeat: int, load: float):
    """What a (trace, load level) offers: its cluster, copies, compression and peak GPU demand."""
    from gpuslice.sim.timed_trace import repeat_trace
    from offered_load import cluster_gpus, compression_for, peak_gpus

    base = base_trace(trace_name, scale)
    if ratio is not None:
        repeat, load, _ = compression_for(base, ratio)
    played = repeat_trace(base, repeat)
    total = cluster_gpus(base)
    return {
        "trace": trace_name, "level": level, "offered_target": ratio, "repeat": repeat, "load": load,
        "nodes": len(base.nodes), "cluster_gpus": total, "base_pods": len(base.jobs),
        "peak_gpus": round(peak_gpus(played, load), 1), "offered": round(peak_gpus(played, load) / total, 3),
        "estimate_rank_corr": rank_corr(trace_name, scale),
    }  # fmt: skip


@lru_cache(maxsize=8)
def rank_corr(trace_name: str, scale: Scale) -> float:
    """Spearman correlation of sjf-predicted's cross-fitted estimates with the run times, uncensored pods
    of one copy."""
    import numpy as np
    from scipy.stats import spearmanr

    from gpuslice.sim.duration_model import cross_fitted

    jobs = base_trace(trace_name, scale).jobs
    estimates = cross_fitted(jobs)
    keep = np.array([not j.censored for j in jobs])
    durations = np.array([j.duration for j in jobs])
    return round(float(spearmanr(estimates[keep], durations[keep]).statistic), 3)


def parse_level(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=RATIO, e.g. heavy=2.5")
    try:
        ratio = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: RATIO must be a number") from None
    if not ratio > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: RATIO must be positive")
    return name, ratio


def run_key(row: dict) -> tuple:
    """A run's identity, read by field name from its row (or from the fields of a run to start)."""
    return tuple(row.get(k) for k in KEY)


def done_keys(path: Path) -> set[tuple]:
    if not path.exists():
        return set()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {run_key(r) for r in rows if "queue" in r}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace-dir", default=None)
    parser.add_argument("--traces", nargs="+", default=["default"])
    parser.add_argument("--node-stride", type=int, default=1)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--offered", type=parse_level, nargs="+", default=None)
    parser.add_argument("--loads", type=float, nargs="+", default=[30000.0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--placements", nargs="+", default=["fgd", "bestfit"])
    parser.add_argument("--setups", nargs="+", default=SETUPS)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/sim_replay_table.jsonl"))
    args = parser.parse_args()
    if args.node_stride < 1 or args.window < 0 or args.repeat < 1 or args.jobs < 1:
        parser.error("--node-stride, --repeat and --jobs must be >= 1, --window >= 0")
    scale = Scale(args.trace_dir, args.node_stride, args.window)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "load_average": os.getloadavg()}), flush=True)
    # (name, offered ratio, load): a ratio picks copies and compression per trace; else --loads/--repeat
    levels = (
        [(n, r, 0.0) for n, r in args.offered]
        if args.offered
        else [(f"load {load:g}", None, load) for load in args.loads]
    )
    done = done_keys(args.out)
    with ProcessPoolExecutor(args.jobs) as pool, args.out.open("a") as out:
        runs = []
        for trace_name, (level, ratio, load) in product(args.traces, levels):
            info = describe(trace_name, scale, level, ratio, args.repeat, load)
            info["node_stride"], info["window"] = scale.node_stride, scale.window
            print(json.dumps(info), flush=True)
            out.write(json.dumps({"kind": "level", **info}) + "\n")
            for placement, setup in product(args.placements, args.setups):
                if run_key({**info, "queue": setup, "placement": placement}) in done:
                    continue
                runs.append(
                    (
                        info,
                        pool.submit(run, trace_name, scale, setup, placement, info["load"], info["repeat"]),
                    )
                )
        for info, future in runs:
            row = {"level": info["level"], "offered": info["offered"], **future.result()}
            row["load_average_1m"] = round(os.getloadavg()[0], 1)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
