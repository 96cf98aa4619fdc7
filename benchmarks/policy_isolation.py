"""What running policy files out of process costs, and what a hostile file costs a real server.

    .venv/bin/python benchmarks/policy_isolation.py                # both parts
    .venv/bin/python benchmarks/policy_isolation.py --part sim     # only the side-by-side replay
    .venv/bin/python benchmarks/policy_isolation.py --part serve   # only the hostile corpus in serve

1. ``sim openb`` on the default trace with ``examples/policies/least_loaded.py`` three ways, alternating,
   ``--rounds`` each: in process (the thread guard, ``GuardConfig(isolate=False)``), with a worker
   process per call (what serve and the extender do: ``policy_process.py``), and the whole run in a
   worker (what a replay does: ``run_isolation.py``). Wall time of the replay, and of each guarded hook
   call (p50/p99) where the calls are made in this process: around ``HookGuard.call`` (in process) and
   ``IsolatedGuard.call`` (a round trip to the worker). All replays must place every pod alike (checked).
2. Each file of ``tests/programs/hostile/`` in a real ``gpuslice serve --simulate dgx-h100`` (queue
   files loaded through ``POST /v1/policies`` while three jobs wait; placement files given at start,
   one job submitted every 0.3 s), until it is detached: ``/v1/health`` p50/p99/max asked every 20 ms
   meanwhile, how long until the detach, the fault kinds, the server's RSS growth.

Prints Markdown tables for ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "server"))
sys.path.insert(0, str(REPO / "tests"))

from gpuslice.programs import guard as guard_module  # noqa: E402
from gpuslice.programs import guard_isolated  # noqa: E402
from gpuslice.programs.guard import GuardConfig  # noqa: E402
from gpuslice.sim import openb  # noqa: E402
from gpuslice.sim.openb import replay  # noqa: E402
from gpuslice.sim.trace import load_trace  # noqa: E402

POLICY = str(REPO / "examples" / "policies" / "least_loaded.py")


def _timed(calls: list[float], original: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(self, *args)
        finally:
            calls.append(time.perf_counter() - started)

    return call


# (label, GuardConfig, the guard class whose ``call`` is one guarded hook call there)
MODES = (
    ("in process (thread guard)", GuardConfig(abandon=False, isolate=False), guard_module.HookGuard),
    ("a worker per call (as serve)", GuardConfig(abandon=False), guard_isolated.IsolatedGuard),
    ("the whole run in a worker", GuardConfig(abandon=False), None),
)


def _one_replay(trace: Any, mode: int) -> tuple[float, list[float], Any]:
    label, config, owner = MODES[mode]
    calls: list[float] = []
    saved = owner.call if owner is not None else None
    if owner is not None:
        owner.call = _timed(calls, saved)  # type: ignore[method-assign]
    # "a worker per call" is what serve and the extender do; a replay sends its file's whole run to a
    # worker instead, so here the replay is told the file is none of its business (its guard config
    # still builds the per-call worker).
    is_path = openb.is_policy_path
    if mode == 1:
        openb.is_policy_path = lambda _: False  # type: ignore[assignment]
    try:
        started = time.perf_counter()
        result = replay(trace, POLICY, 42, guard_config=config)
        wall = time.perf_counter() - started
    finally:
        openb.is_policy_path = is_path  # type: ignore[assignment]
        if owner is not None:
            owner.call = saved  # type: ignore[method-assign]
    print(f"  {label}: {wall:.2f} s, {len(calls)} calls", file=sys.stderr, flush=True)
    return wall, calls, tuple(a.tobytes() for a in (result.allocated_gpu_milli, result.fragmented_gpu_milli))


def sim_part(rounds: int) -> None:
    trace = load_trace()
    rows: dict[int, list[tuple[float, list[float]]]] = {m: [] for m in range(len(MODES))}
    placed = set()
    for _ in range(rounds):
        for mode in range(len(MODES)):
            wall, calls, placement = _one_replay(trace, mode)
            rows[mode].append((wall, calls))
            placed.add(placement)
    assert len(placed) == 1, "the replays placed pods differently"
    print("| where the file runs | replay wall s (each round) | guarded calls | per call p50 µs | p99 µs |")
    print("|---|---|---:|---:|---:|")
    for mode, (label, _, owner) in enumerate(MODES):
        walls = ", ".join(f"{w:.2f}" for w, _ in rows[mode])
        if owner is None:  # the calls ran in the child, timed by nobody here
            print(f"| {label} | {walls} | as in process | - | - |")
            continue
        every = np.array([c for _, calls in rows[mode] for c in calls]) * 1e6
        n = len(rows[mode][0][1])
        p50, p99 = np.percentile(every, 50), np.percentile(every, 99)
        print(f"| {label} | {walls} | {n:,} | {p50:.0f} | {p99:.0f} |")
    best = [min(w for w, _ in rows[m]) for m in range(len(MODES))]
    print(
        f"\nbest round each, against in process: a worker per call {best[1] / best[0]:.2f}x, "
        f"the whole run in a worker {best[2] / best[0]:.2f}x"
    )


def serve_part() -> None:
    from server_helpers import ServerProcess, kill_jobs
    from test_serve_hostile import FILES, HealthProbe, expected, placement_slot, queue_slot, rss_bytes

    print("| file | expect | detached after s | faults | health p50 ms | p99 ms | max ms | server RSS +MiB |")
    print("|---|---|---:|---|---:|---:|---:|---:|")

    def measure(server: ServerProcess, path: Path, read: Callable[..., dict[str, Any]],
                drive: Callable[[], None]) -> None:  # fmt: skip
        probe = HealthProbe(server.url)
        before = rss_bytes(server.proc.pid)  # type: ignore[union-attr]
        mark = time.perf_counter()
        deadline = time.monotonic() + 180
        try:
            drive()
            while not (slot := read(server))["detached"] and time.monotonic() < deadline:
                if read is placement_slot:
                    server.submit(["sleep", "3600"], memory="4GiB", compute_percent=10)
                time.sleep(0.3)
            took = time.perf_counter() - mark
            grown = (rss_bytes(server.proc.pid) - before) / 2**20  # type: ignore[union-attr]
            latencies = np.array([t for when, t in probe.latencies if when >= mark]) * 1000
        finally:
            probe.close()
        faults = ", ".join(f"{f['reason']} ×{f['count']}" for f in slot["faults"])
        print(f"| {path.stem} | {' or '.join(sorted(expected(path)))} | "
              f"{took:.1f}{'' if slot['detached'] else ' (not detached)'} | {faults} | "
              f"{np.percentile(latencies, 50):.1f} | {np.percentile(latencies, 99):.1f} | "
              f"{latencies.max():.1f} | {grown:+.0f} |", flush=True)  # fmt: skip

    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        server = ServerProcess(Path(folder) / "q" / "state", "--simulate", "dgx-h100").start()
        try:
            for _ in range(4):
                server.submit(["sleep", "3600"], gpus=8)
            for path in [p for p in FILES if p.stem.startswith("q_") and "rejected" not in expected(p)]:
                body = {"filename": path.name, "source": path.read_text()}

                def load(body: dict[str, str] = body) -> None:
                    answer = server.http.post("/v1/policies", json=body)
                    assert answer.status_code == 201, answer.text

                measure(server, path, queue_slot, load)
                server.http.delete("/v1/policies/queue")
        finally:
            server.stop()
            kill_jobs(server.state_dir)
        for path in [p for p in FILES if p.stem.startswith("p_")]:
            state = Path(folder) / path.stem / "state"
            server = ServerProcess(state, "--simulate", "dgx-h100", "--placement", str(path)).start()
            try:
                measure(server, path, placement_slot, lambda: None)
            finally:
                server.stop()
                kill_jobs(server.state_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("sim", "serve", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=2, help="replays per side (sim part)")
    args = parser.parse_args()
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    if args.part in ("sim", "both"):
        sim_part(args.rounds)
        print()
    if args.part in ("serve", "both"):
        serve_part()
    print(f"\nload at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
