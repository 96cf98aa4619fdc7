"""Speed and memory of the openb replay.

    .venv/bin/python benchmarks/openb_speed.py   # one FGD run ×3, peak memory, 6 × 10 sweep (--jobs 2)

Measures (targets): one FGD run of the default trace (≈ 10.9k pod arrivals on 6212 GPUs)
≤ 5 s wall; peak resident memory of a process doing one run < 500 MB; the whole 6-policy × 10-seed
default sweep with 2 worker processes < 3 minutes. Each single run happens in a fresh child process so
its peak RSS (ru_maxrss of the child) is its own.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import resource
import sys
import time
from datetime import date

from gpuslice.policies import FGD_PAPER_POLICIES
from gpuslice.sim.sweep import run_sweep
from gpuslice.sim.trace import load_trace


def _one_run(policy: str, seed: int, queue: mp.Queue) -> None:
    started = time.perf_counter()
    trace = load_trace("default")
    loaded = time.perf_counter()
    from gpuslice.sim.openb import replay

    result = replay(trace, policy, seed)
    queue.put((loaded - started, result.wall_seconds, result.pods))


def single_run(policy: str, seed: int) -> tuple[float, float, int, float]:
    """(load s, replay s, pods, child peak RSS MiB) of one run in a fresh process."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = ctx.Process(target=_one_run, args=(policy, seed, queue))
    proc.start()
    load_s, replay_s, pods = queue.get()
    proc.join()
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # max over children so far
    return load_s, replay_s, pods, max(peak_kib, before) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args()
    lines = [
        f"{date.today().isoformat()} · {platform.node()} ({platform.machine()}, "
        f"{mp.cpu_count()} cores, Python {platform.python_version()})",
        "",
        "| measurement | value | target |",
        "|---|---:|---:|",
    ]
    runs = [single_run("fgd", 42 + i) for i in range(args.repeats)]
    best = min(r[1] for r in runs)
    worst = max(r[1] for r in runs)
    lines.append(
        f"| FGD, default trace, one run (replay only; best / worst of {args.repeats}) | "
        f"{best:.2f} s / {worst:.2f} s | ≤ 5 s |"
    )
    lines.append(f"| trace CSV loading | {min(r[0] for r in runs):.2f} s | — |")
    lines.append(f"| pod arrivals per run | {runs[0][2]} | — |")
    lines.append(
        f"| peak RSS of a process doing one FGD run | {max(r[3] for r in runs):.0f} MiB | < 500 MB |"
    )
    if not args.skip_sweep:
        started = time.perf_counter()
        results = run_sweep(["default"], list(FGD_PAPER_POLICIES), list(range(42, 52)), jobs=args.jobs)
        sweep_s = time.perf_counter() - started
        lines.append(
            f"| 6 policies × 10 seeds, default trace, --jobs {args.jobs} ({len(results)} runs) | "
            f"{sweep_s:.0f} s | < 180 s |"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
