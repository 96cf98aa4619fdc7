"""Overhead of a policy file (verified, loaded, guarded) against the same policy built in.

    .venv/bin/python benchmarks/policy_overhead.py                 # FGD, openb default trace, seeds 42-46
    .venv/bin/python benchmarks/policy_overhead.py --seeds 42-51 --rounds 2

1. openb default trace, FGD built-in vs the same FGD as a file (``gpuslice policy export fgd``) through
   ``sim.openb.replay`` (the path ``gpuslice sim openb --policy FILE`` takes). Runs alternate built-in /
   file per seed so machine load hits both alike; CPU time (``time.process_time``, this process and its
   threads, so the guard's watchdog thread is included) and wall time per run; overhead = file / built-in
   − 1 of the summed CPU times. The results must be identical (checked).
2. The slowest guarded call per hook, to size the budgets (``guard.DEFAULT_BUDGETS``): FGD over a
   6,000-node cluster (the openb nodes ×5, every node stale: the first score of a shape), the
   priority-fair queue file ordering 2,000 jobs, the LFU + stride files on a memsim workload.

The machine is shared: read CPU time, and the load average printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from gpuslice.cli.sim import parse_seeds
from gpuslice.ledger.ledger import Ledger
from gpuslice.memory import SimConfig, make_workload, simulate
from gpuslice.memory.hooks import BYPASS, DecisionContext, MemoryOps
from gpuslice.policies import PlacementOps, PolicyContext
from gpuslice.policies.queue import QUEUE
from gpuslice.policies.queue.base import QueuedJob, QueueView, order_pending
from gpuslice.programs.export import export_source
from gpuslice.programs.guard import DEFAULT_BUDGETS, guard
from gpuslice.programs.loader import load_file, memory_ops
from gpuslice.sim import openb
from gpuslice.sim.openb import replay
from gpuslice.sim.trace import load_trace
from gpuslice.workload.job import JobSpec, Priority
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

FILES = Path(tempfile.mkdtemp(prefix="gpuslice-builtin-files-"))  # the built-ins written as files


def builtin_file(file: str, name: str, family: str) -> Path:
    """``FILES / file``: built-in ``name`` as a policy file (what ``gpuslice policy export`` writes)."""
    path = FILES / file
    if not path.exists():
        path.write_text(export_source(name, family), encoding="utf-8")
    return path


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


class _CountingPlacer(openb.Placer):
    """The replay's Placer, remembering its policy so the guard's call count can be read afterwards."""

    last_policy: object = None

    def __init__(self, ledger: Ledger, policy: PlacementOps, rng: np.random.Generator | None = None) -> None:
        super().__init__(ledger, policy, rng)
        _CountingPlacer.last_policy = policy


def replay_overhead(seeds: list[int], rounds: int) -> list[str]:
    openb.Placer = _CountingPlacer  # type: ignore[misc]  # only to count guarded calls
    trace = load_trace("default")
    fgd_file = str(builtin_file("fgd.py", "fgd", "placement"))
    cpu = {"fgd": 0.0, "file": 0.0}
    wall = {"fgd": 0.0, "file": 0.0}
    calls: dict[int, int] = {}
    rows = []
    for seed in seeds:
        per: dict[str, tuple[float, float]] = {}
        results = {}
        for _ in range(rounds):
            for key, policy in (("fgd", "fgd"), ("file", fgd_file)):
                c0, w0 = time.process_time(), time.perf_counter()
                results[key] = replay(trace, policy, seed)
                if key == "file":
                    calls[seed] = _CountingPlacer.last_policy.guard.calls  # type: ignore[attr-defined]
                c, w = time.process_time() - c0, time.perf_counter() - w0
                best = per.get(key)
                per[key] = (c, w) if best is None or c < best[0] else best
        a, b = results["fgd"], results["file"]
        same = (
            a.failed_pods == b.failed_pods
            and np.array_equal(a.allocated_gpu_milli, b.allocated_gpu_milli)
            and np.array_equal(a.fragmented_gpu_milli, b.fragmented_gpu_milli)
            and b.fallbacks == {}
        )
        if not same:
            raise SystemExit(f"seed {seed}: the file-loaded FGD decided differently from the built-in")
        for key in cpu:
            cpu[key] += per[key][0]
            wall[key] += per[key][1]
        over = per["file"][0] / per["fgd"][0] - 1
        rows.append(
            f"| {seed} | {len(a.allocated_gpu_milli):,} | {per['fgd'][0]:.2f} | {per['file'][0]:.2f} | "
            f"{over * 100:+.1f} % | {per['fgd'][1]:.2f} | {per['file'][1]:.2f} | identical |"
        )
        print(rows[-1], f"({load()})", flush=True)
    total = cpu["file"] / cpu["fgd"] - 1
    guarded, bare = guard_cost()
    per_call = guarded - bare
    expected = sum(calls.values()) * per_call / cpu["fgd"]
    note = (
        f"guarded calls per run (FGD overrides score and pick_gpus; inherited hooks run unguarded): "
        f"{min(calls.values()):,}–{max(calls.values()):,}; × {per_call * 1e6:.2f} µs each = "
        f"{expected * 100:.1f} % expected from the guard alone"
    )
    return [
        "| seed | pods | built-in CPU s | file CPU s | overhead | built-in wall s | file wall s "
        "| decisions |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        f"| all | | {cpu['fgd']:.2f} | {cpu['file']:.2f} | **{total * 100:+.1f} %** | {wall['fgd']:.2f} | "
        f"{wall['file']:.2f} | |",
        "",
        note,
    ]


def slowest_calls() -> list[str]:
    lines = ["| family | workload | hook | slowest call, wall ms | budget, CPU ms |", "|---|---|---|---|---|"]
    # placement: FGD over 6,000+ nodes, every node stale (first score of each shape)
    trace = load_trace("default")
    nodes = [n for _ in range(5) for n in trace.nodes]
    ledger = Ledger(nodes)
    target = TargetWorkload.from_requests(p.request for p in trace.pods)
    context = PolicyContext(rng=np.random.default_rng(0), target=target)
    loaded = load_file(builtin_file("fgd.py", "fgd", "placement"))
    ops = guard("placement", loaded.instantiate(ledger.view, context), PlacementOps(ledger.view, context))
    everything = np.arange(ledger.node_count)
    cpu = 0.0
    for req in (
        Request(cpu_milli=4000, num_gpu=1, gpu_milli=500),
        Request(cpu_milli=8000, num_gpu=2, gpu_milli=1000),
    ):
        started = time.thread_time()
        ops.score(ledger.view, req, everything)
        cpu = max(cpu, time.thread_time() - started)
    lines.append(
        f"| placement | FGD, {ledger.node_count:,} nodes, every node stale | score | "
        f"{ops.guard.slowest['score'] * 1e3:.1f} (CPU {cpu * 1e3:.1f}) | "
        f"{DEFAULT_BUDGETS['placement'] * 1e3:.0f} |"
    )
    # queue: priority-fair file ordering 2,000 pending jobs
    rng = np.random.default_rng(1)
    jobs = [
        QueuedJob(
            f"j{i}",
            JobSpec(command=("x",), priority=Priority(int(rng.integers(0, 4))), tenant=f"t{i % 7}"),
            float(rng.uniform(0, 3600)),
            i,
        )
        for i in range(2000)
    ]
    queue_file = builtin_file("priority_fair.py", "priority-fair", "queue")
    qops = guard("queue", load_file(queue_file).instantiate(), QUEUE["fifo"]())
    order_pending(qops, QueueView(now=3600.0), jobs)
    for hook, seconds in sorted(qops.guard.slowest.items()):
        lines.append(
            f"| queue | priority-fair, 2,000 jobs | {hook} | {seconds * 1e3:.3f} | "
            f"{DEFAULT_BUDGETS['queue'] * 1e3:.0f} |"
        )
    # memory: LFU + stride files, every hook visible
    lfu, stride = builtin_file("lfu.py", "lfu", "eviction"), builtin_file("stride.py", "stride", "prefetch")
    mops = memory_ops(str(lfu), str(stride))
    workload = make_workload("llm-moe-decode", scale=0.2)
    simulate(workload, mops, SimConfig(oversub=1.5, visibility="full"))
    for half, family in ((mops.evict, "eviction"), (mops.prefetch, "prefetch")):
        for hook, seconds in sorted(half.guard.slowest.items()):
            lines.append(
                f"| {family} | {half.name}, llm-moe-decode ×0.2 ({half.guard.calls:,} calls) | {hook} | "
                f"{seconds * 1e3:.3f} | {DEFAULT_BUDGETS[family] * 1e3:.0f} |"
            )
    return lines


class _Bypass(MemoryOps):
    name, kind = "bypass", "evict"

    def block_access(self, view: object, block: int, hits: int, ctx: DecisionContext) -> int:
        return BYPASS


def guard_cost(calls: int = 200_000) -> tuple[float, float]:
    """CPU seconds per call of a trivial memory hook, (guarded, bare), best of 2: the guard's own cost is
    the difference."""
    bare, guarded = _Bypass(), guard("eviction", _Bypass(), MemoryOps())
    ctx = DecisionContext("reorder")
    cost: dict[str, float] = {}
    for name, ops in (("bare", bare), ("guarded", guarded)) * 2:
        started = time.process_time()
        for i in range(calls):
            ops.block_access(None, i, 1, ctx)
        cost[name] = min(cost.get(name, 1.0), (time.process_time() - started) / calls)
    return cost["guarded"], cost["bare"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="42-46", help="openb seeds (42-46, 42,43 …)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs per seed and policy; the least CPU counts"
    )
    args = parser.parse_args()
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {platform.node()} ({platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}) · {load()}\n",
        flush=True,
    )
    for line in replay_overhead(parse_seeds(args.seeds), args.rounds):
        print(line)
    print(f"\n({load()})\n")
    for line in slowest_calls():
        print(line)
    guarded, bare = guard_cost()
    print(
        f"\nguard cost: {guarded * 1e6:.2f} µs CPU per call guarded vs {bare * 1e6:.2f} µs bare "
        "(a hook that returns a constant; best of 2 × 200,000)"
    )
    print(f"\n({load()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
