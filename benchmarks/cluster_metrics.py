"""Cluster metrics at 1,000 nodes of 8 GPUs with 10 pods a node: the extender's GET /metrics (time per
scrape, median and p99, its size and series), the cluster view the dashboard builds each refresh, how
long a read holds the cache's lock, and what scrapes beside kube-scheduler's filters cost them. Writes
benchmarks/out/cluster_metrics.md.

The cluster is benchmarks/cluster_dashboard.py's ``filled`` (benchmarks/extender.py's ``cluster``: four GPU
models, split count 10, filled by binding pods of its first five shapes through ``ClusterState.bind``),
plus ``--pending`` pods of 8 GPUs each refused by /filter over every node, so the pending series exist;
the filter rounds are that benchmark's ``filter_latency`` with /metrics asked back to back.
/metrics is the real extender app (``create_app``) in-process over httpx's ASGI transport, as
benchmarks/extender.py times /filter: the whole exposition is built and sent, but no socket.

    .venv/bin/python benchmarks/cluster_metrics.py                       # 1,000 nodes, 10 pods a node
    .venv/bin/python benchmarks/cluster_metrics.py --nodes 100 --scrapes 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_dashboard import filled, filter_latency, serve  # the dashboard benchmark's cluster, server
from extender import pod, scheduling
from gpuslice.k8s.extender import ClusterState, create_app
from gpuslice.k8s.extender import snapshot as snapshot_module
from gpuslice.k8s.extender.snapshot import cluster_figures, cluster_view

OUT = Path(__file__).resolve().parent / "out" / "cluster_metrics.md"


def stats(ms: list[float]) -> dict[str, float]:
    return {"median": statistics.median(ms), "p99": float(np.percentile(ms, 99)), "max": max(ms)}


def refuse(state: ClusterState, names: list[str], pending: int) -> int:
    """``pending`` pods asking for 8 whole GPUs, filtered over every node; how many were refused."""
    refused = 0
    for k in range(pending):
        p = pod(10_000_000 + k, {"gpuslice.io/gpu": "8"}, {}, "bestfit")
        refused += not state.filter(p, names).passed
    return refused


async def scrapes(state: ClusterState, count: int) -> tuple[list[float], list[float], bytes]:
    """Wall and CPU milliseconds of each GET /metrics (CPU: the process's, as the exposition is built on a
    worker thread), and the last body. The first 5 are not counted."""
    app = create_app(state)
    wall: list[float] = []
    cpu: list[float] = []
    body = b""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://extender") as http:
        for i in range(count + 5):
            cpu_start = time.process_time()
            start = time.perf_counter()
            answer = await http.get("/metrics")
            took = (time.perf_counter() - start) * 1e3
            spent = (time.process_time() - cpu_start) * 1e3
            assert answer.status_code == 200
            body = answer.content
            if i >= 5:
                wall.append(took)
                cpu.append(spent)
    return wall, cpu, body


def timed(fn: Any, count: int) -> tuple[list[float], list[float]]:
    wall: list[float] = []
    cpu: list[float] = []
    for i in range(count + 2):
        cpu_start = time.thread_time()
        start = time.perf_counter()
        fn()
        if i >= 2:
            wall.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.thread_time() - cpu_start) * 1e3)
    return wall, cpu


def lock_hold(state: ClusterState, count: int) -> tuple[list[float], list[float]]:
    """Milliseconds a read holds the cache's lock (``snapshot._read``: the copy of the free column and
    of the list of pods, then the check that the ledger was not rebuilt meanwhile), wall and CPU, summed
    per read, timed by a wrapper around the lock."""
    real = state.cache.lock
    held: list[float] = []
    held_cpu: list[float] = []

    class Timed:
        def __enter__(self) -> None:
            real.acquire()
            self.start = time.perf_counter()
            self.cpu = time.thread_time()

        def __exit__(self, *exc: object) -> None:
            held.append((time.perf_counter() - self.start) * 1e3)
            held_cpu.append((time.thread_time() - self.cpu) * 1e3)
            real.release()

    state.cache.lock = Timed()  # type: ignore[assignment]
    try:
        for _ in range(count):
            snapshot_module._read(state)
            held[-2:] = [sum(held[-2:])]
            held_cpu[-2:] = [sum(held_cpu[-2:])]
    finally:
        state.cache.lock = real
    return held, held_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods-per-node", type=int, default=10)
    parser.add_argument("--pending", type=int, default=50, help="pods of 8 GPUs refused by /filter")
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--views", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=300, help="filters timed with, and without, scrapes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--markdown", type=Path, default=OUT)
    args = parser.parse_args()

    started = time.perf_counter()
    state, bound, names = filled(args.nodes, args.pods_per_node, args.seed)
    refused = refuse(state, names, args.pending)
    fill_s = time.perf_counter() - started
    print(f"filled: {args.nodes} nodes, {bound} pods bound, {refused} refused ({fill_s:.0f} s)", flush=True)

    wall, cpu, body = asyncio.run(scrapes(state, args.scrapes))
    families = list(text_string_to_metric_families(body.decode()))
    series = sum(len(f.samples) for f in families)
    cluster_series = sum(len(f.samples) for f in families if f.name.startswith("gpuslice_cluster_"))
    figures_wall, figures_cpu = timed(lambda: cluster_figures(state), args.views)
    view_wall, view_cpu = timed(lambda: cluster_view(state), args.views)
    held, held_cpu = lock_hold(state, args.views)
    server, port = serve(create_app(state))
    try:
        # scraped back to back, the worst case: Prometheus scrapes every 15-60 s
        filters = filter_latency(port, names, args.rounds, args.seed, path="/metrics", every_s=0.0)
    finally:
        server.should_exit = True

    load = os.getloadavg()
    rows = [
        ("GET /metrics, wall", stats(wall)),
        ("GET /metrics, CPU (all threads)", stats(cpu)),
        ("cluster_figures (the collector's read)", stats(figures_wall)),
        ("cluster_figures, CPU", stats(figures_cpu)),
        ("cluster_view (the dashboard's, before JSON)", stats(view_wall)),
        ("cluster_view, CPU", stats(view_cpu)),
        ("cache lock held by one read (both holds)", stats(held)),
        ("cache lock held by one read, CPU", stats(held_cpu)),
        ("/filter + /prioritize over HTTP, no scrape", stats(filters[False])),
        ("/filter + /prioritize over HTTP, /metrics scraped back to back", stats(filters[True])),
    ]
    lines = [
        "# Cluster metrics at scale",
        "",
        f"Command: `.venv/bin/python benchmarks/cluster_metrics.py --nodes {args.nodes} --pods-per-node "
        f"{args.pods_per_node} --pending {args.pending} --scrapes {args.scrapes} --views {args.views} "
        f"--rounds {args.rounds}`",
        f"Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. Machine: {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        f"({scheduling()}).",
        "",
        f"Cluster: {args.nodes} nodes x 8 GPUs, {bound} pods bound ({args.pods_per_node} a node asked), "
        f"{refused} pods pending.",
        "",
        f"Exposition: {len(body):,} bytes, {series:,} samples, of which {cluster_series:,} are "
        f"gpuslice_cluster_* ({cluster_series - 6 * args.nodes} beside the 6 per node).",
        "",
        "| measure (ms) | median | p99 | max |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {s['median']:.2f} | {s['p99']:.2f} | {s['max']:.2f} |" for name, s in rows),
        "",
    ]
    text = "\n".join(lines)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
