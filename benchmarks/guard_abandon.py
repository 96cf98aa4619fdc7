"""How long a queue policy stuck in one slow numpy call holds up serve's node scheduler.

A guarded queue policy whose ``order_key`` sorts a large array (one C call, GIL released) is asked by
``NodeScheduler.step`` for a pass over a few pending jobs, under the queue family's default budget
(0.5 s). With ``abandon`` on (the default for queue and placement policies) the guard stops waiting once
the hook has burned its CPU share and the default order decides; with it off the pass waits for the
sort. Prints one markdown row per mode: the pass's wall time, the hook's own time, the faults counted.

    .venv/bin/python benchmarks/guard_abandon.py [--elements 60000000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.policies.queue import QueueOps
from gpuslice.programs.guard import GuardConfig, guard
from gpuslice.scheduler.node_scheduler import NodeScheduler
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=60_000_000, help="array size the hook sorts")
    args = parser.parse_args()
    big = np.random.default_rng(0).random(args.elements)
    started = time.perf_counter()
    np.sort(big)
    alone = time.perf_counter() - started

    class SlowSort(QueueOps):
        name = "slow-sort"

        def order_key(self, view, job):
            np.sort(big)  # one long C call: the watchdog cannot interrupt it
            return (job.seq,)

    machine = Machine("bench", tuple(GpuInfo(i, f"GPU-{i}", "H100", 80 * GiB) for i in range(1)), None)
    print(f"one np.sort of {args.elements:,} floats alone: {alone:.2f} s")
    print("| abandon | step wall s | faults |")
    print("|---|---:|---|")
    for abandon in (True, False):
        s = NodeScheduler(machine)
        s.policy = guard("queue", SlowSort(), QueueOps(), GuardConfig(abandon=abandon))
        for i in range(3):
            s.submit(f"j{i}", JobSpec(("run",), gpus=1), 0)
        started = time.perf_counter()
        s.step(1)
        wall = time.perf_counter() - started
        faults = dict(s.policy.guard.fault_counts())
        print(f"| {'on' if abandon else 'off'} | {wall:.2f} | {faults} |")
        time.sleep(alone * 3)  # let abandoned sorts finish before the next mode is timed


if __name__ == "__main__":
    main()
