"""What a hot swap costs a running ``gpuslice serve``, and how long one can wait for a scheduling pass.

    .venv/bin/python benchmarks/policy_swap.py                  # examples/policies/small_first.py, 300 jobs
    .venv/bin/python benchmarks/policy_swap.py --rounds 500 --pending 1000

1. ``load_source``: verify the text and run its module body, in the API's thread, outside every lock.
2. ``Daemon.load_policy``: instantiate with the carried maps and swap in the slot (no daemon lock), then
   assign the scheduler's policy and store the event under the daemon's lock — an upper bound on how
   long a swap can delay a scheduling pass.
3. One scheduling pass (``NodeScheduler.step``) over ``--pending`` queued jobs with the file loaded and
   with the built-in: the longest a swap can wait for the pass in progress (it lands after it).

A simulated DGX H100 (``LocalNode``, nothing is launched: the passes are called directly). CPU time of
this thread (``time.thread_time``); the machine is shared, so the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpuslice.programs.loader import load_source
from gpuslice.server.daemon import Daemon
from gpuslice.server.local_node import LocalNode
from gpuslice.server.store import Store
from gpuslice.workload.job import JobSpec

ROOT = Path(__file__).resolve().parents[1]


def cpu_ms(fn: Callable[[], object], rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        started = time.thread_time()
        fn()
        out.append((time.thread_time() - started) * 1e3)
    return sorted(out)


def quantiles(ms: list[float]) -> str:
    return f"p50 {ms[len(ms) // 2]:.2f} ms, p99 {ms[max(0, int(len(ms) * 0.99) - 1)]:.2f} ms (n={len(ms)})"


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--policy", type=Path, default=ROOT / "examples" / "policies" / "small_first.py")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--pending", type=int, default=300)
    args = parser.parse_args()
    source = args.policy.read_text()

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        node = LocalNode.open(state, "dgx-h100", "soft")
        store = Store(state / "gpuslice.db")
        daemon = Daemon(store, node.machine, node, state, simulated=True)
        loaded = load_source(source, args.policy.name)
        verify = cpu_ms(lambda: load_source(source, args.policy.name), args.rounds)
        swap = cpu_ms(lambda: daemon.policy_admin.load_policy(loaded), args.rounds)

        daemon.submit(JobSpec(command=("hold",), gpus=8))  # takes every GPU: the rest stay queued
        daemon.scheduler.step(time.time())
        for i in range(args.pending):
            daemon.submit(JobSpec(command=("x",), gpus=1 + i % 2, tenant=f"t{i % 7}"))
        now = time.time()
        passes = {}
        for label in ("file", "built-in"):
            if label == "built-in":
                daemon.policy_admin.unload_policy("queue")
            passes[label] = cpu_ms(lambda: daemon.scheduler.step(now), max(5, args.rounds // 10))
        store.close()
        node.close(jobs_running=False)

    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"policy: {args.policy.relative_to(ROOT) if args.policy.is_relative_to(ROOT) else args.policy}")
    print(f"verify + load (API thread, no lock):           {quantiles(verify)}")
    print(f"swap (PolicyAdmin.load_policy):                     {quantiles(swap)}")
    for label, ms in passes.items():
        print(f"one pass over {args.pending} pending jobs, {label:<8}:   {quantiles(ms)}")


if __name__ == "__main__":
    main()
