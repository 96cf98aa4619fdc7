"""Exporter overhead of ``gpuslice serve``: ``GET /metrics`` latency and size with 8 GPUs and 500 jobs.

Setup: a real ``gpuslice serve --simulate dgx-h100`` process (8 simulated H100s) on a free port.
1. ``--running`` memory-only shares of 2 GiB are submitted and started (slices spread over the 8
   GPUs; ``--fake-loads`` of them run ``gpuslice-fake-load`` so their memory use is measured, the rest
   run ``sleep``; none may be preempted); then ``--pending`` 8-GPU jobs that cannot start, so the
   queue holds them.
   Running + pending = 500 by default: 64 running (8 slices per GPU) and 436 queued. Every running
   job is a real supervisor process the daemon polls each tick, so on a small shared machine a few
   hundred running jobs take many minutes to start; the exposition grows with running slices (one
   series each per metric), so --running is the figure to raise on a bigger machine.
2. Idle: the CPU time (user + system) of each of the server's threads over ``--idle`` seconds with no
   client (psutil). The busiest is the daemon loop's: what the loop costs by itself with this many jobs.
3. ``--scrapes`` sequential ``GET /metrics`` from one client: wall time per scrape (p50 / p99 / max),
   the exposition's size (bytes, samples), and the CPU time per scrape of every thread but the daemon
   loop's (the HTTP event loop and the worker that builds the exposition), net of their idle rate.

Usage: ``.venv/bin/python benchmarks/scrape.py [--running 64] [--pending 436] [--scrapes 500]
[--markdown FILE]`` (FILE defaults to benchmarks/out/scrape.md). Wall times on a shared machine are
polluted by other work; the CPU-time figure is the one to compare, and the load average is recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpuslice.node import launcher
from gpuslice.server.store import Store
from gpuslice.workload.job import JobState

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import BIN, free_port, start_server  # the serve benchmark's server start-up


def kill_jobs(state_dir: Path) -> None:
    """SIGKILL the process groups of the jobs this run started (their pgid and start time are in the
    store; jobs outlive the server by design)."""
    store = Store(state_dir / "gpuslice.db")
    try:
        for job in store.jobs([JobState.RUNNING]):
            if job.pgid and job.proc_start_time and launcher.is_alive(job.pgid, job.proc_start_time):
                with contextlib.suppress(OSError):
                    os.killpg(job.pgid, signal.SIGKILL)
    finally:
        store.close()


def thread_cpu(proc: psutil.Process) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in proc.threads()}


def delta(after: dict[int, float], before: dict[int, float]) -> dict[int, float]:
    return {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def fill(http: httpx.Client, running: int, fake_loads: int, pending: int, progress: Progress) -> None:
    task = progress.add_task("submit running shares", total=running)
    fake = [str(BIN / "gpuslice-fake-load"), "--mem", "1GiB", "--seconds", "3600"]
    for i in range(running):
        command = fake if i < fake_loads else ["sleep", "3600"]
        body = {"command": command, "memory": "2GiB", "tenant": f"t{i % 4}", "preemptible": False}
        r = http.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        progress.advance(task)
    task = progress.add_task("wait until they run", total=running)
    while True:
        n = len(http.get("/v1/jobs", params={"state": "RUNNING", "limit": 10000}).json())
        progress.update(task, completed=n)
        if n >= running:
            break
        time.sleep(0.5)
    task = progress.add_task("submit pending 8-GPU jobs", total=pending)
    for i in range(pending):
        body = {"command": ["sleep", "1"], "gpus": 8, "tenant": f"t{i % 4}",
                "priority": ["normal", "low", "high"][i % 3]}  # fmt: skip
        assert http.post("/v1/jobs", json=body).status_code == 201
        progress.advance(task)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=64)
    parser.add_argument("--fake-loads", type=int, default=16)
    parser.add_argument("--pending", type=int, default=436)
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--markdown", type=Path, default=Path("benchmarks/out/scrape.md"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        state = Path(tmp) / "state"
        proc = start_server(state, port)
        server = psutil.Process(proc.pid)
        token = (state / "token").read_text().strip()
        url = f"http://127.0.0.1:{port}"
        try:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn())  # fmt: skip
            with (
                httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
                Progress(*columns) as progress,
            ):
                fill(http, args.running, args.fake_loads, args.pending, progress)
                time.sleep(2.0)  # a few monitor passes: readings and measured memory are in
                before = thread_cpu(server)
                time.sleep(args.idle)
                idle = delta(thread_cpu(server), before)
                loop_thread = max(idle, key=lambda tid: idle[tid])  # the daemon loop: busiest when idle
                loop_rate = idle[loop_thread] / args.idle
                other_idle_rate = sum(v for tid, v in idle.items() if tid != loop_thread) / args.idle
                task = progress.add_task("scrape /metrics", total=args.scrapes)
                walls, sizes, samples = [], [], 0
                before, started = thread_cpu(server), time.perf_counter()
                for _ in range(args.scrapes):
                    t0 = time.perf_counter()
                    r = http.get("/metrics")
                    walls.append(time.perf_counter() - t0)
                    assert r.status_code == 200
                    sizes.append(len(r.content))
                    progress.advance(task)
                elapsed = time.perf_counter() - started
                spent = delta(thread_cpu(server), before)
                cpu = sum(v for tid, v in spent.items() if tid != loop_thread) - other_idle_rate * elapsed
                samples = sum(1 for line in r.text.splitlines() if line and not line.startswith("#"))
                jobs = http.get("/v1/health").json()["jobs"]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            kill_jobs(state)

    ms = [w * 1000 for w in walls]
    load = os.getloadavg()[0]
    text = (
        f"`{' '.join(sys.argv)}` on {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, 1-minute load average {load:.1f} at the end; server `--simulate "
        f"dgx-h100` (8 GPUs) with {jobs['RUNNING']} running jobs ({args.fake_loads} fake loads) and "
        f"{jobs['PENDING']} pending, {time.strftime('%Y-%m-%d', time.gmtime())}.\n\n"
        "| figure | value |\n|---|---|\n"
        f"| scrape wall time p50 / p99 / max | {statistics.median(ms):.1f} / {percentile(ms, 99):.1f} / "
        f"{max(ms):.1f} ms |\n"
        f"| server CPU per scrape (threads but the daemon loop's) | {1000 * cpu / args.scrapes:.1f} ms |\n"
        f"| CPU of the daemon loop, no client | {100 * loop_rate:.0f} % of a core |\n"
        f"| exposition size | {statistics.median(sizes) / 1024:.0f} KiB, {samples} samples |\n"
        f"| scrapes | {args.scrapes} sequential, one client |\n"
    )
    print(text)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text)


if __name__ == "__main__":
    main()
