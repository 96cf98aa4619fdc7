"""The extender's cluster dashboard at 1,000 nodes of 8 GPUs with 10 pods a node: how long headless
Chromium takes from navigation start to the GPU map drawn, how big view.json is and how long the
extender takes to build it, and what a page open beside kube-scheduler's calls costs them. Writes
benchmarks/out/cluster_dashboard.md.

The cluster is benchmarks/extender.py's (``cluster``, four GPU models, split count 10), filled by binding
pods of its first five shapes (shares and whole GPUs) through ``ClusterState.bind``, as that benchmark's
fill does. The extender's app (``create_app``, with the dashboard's routes) runs under uvicorn on a free
loopback port; the browser is Debian's chromium and chromedriver through Selenium, as the dashboard tests.

Load: ``performance.mark("map-rendered")`` (cluster.js, after its first draw of the map), whose
startTime counts from navigation start: fetching the page, its script, view.json, parsing it and
drawing the rows in view. Loads are ``VIEW_MAX_AGE_S`` apart, so each one waits for a fresh view build.
Server: ``cluster_view``, its JSON encoding and its gzip called directly, the medians of ``--builds``
calls (each step's wall time, and the CPU time of all three).

    .venv/bin/python benchmarks/cluster_dashboard.py                       # 1,000 nodes, 10 pods a node
    .venv/bin/python benchmarks/cluster_dashboard.py --nodes 100 --loads 3
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extender import SHAPES, cluster, pod, scheduling
from gpuslice.k8s import extender_wire as wire
from gpuslice.k8s.extender import ClusterState, create_app
from gpuslice.k8s.extender.dashboard import GZIP_LEVEL, VIEW_MAX_AGE_S
from gpuslice.k8s.extender.snapshot import cluster_view

BLOCK_ROUNDS = 50  # filter rounds with the page closed, then as many with it open, and so on


def filled(n_nodes: int, pods_per_node: int, seed: int) -> tuple[ClusterState, int, list[str]]:
    """The cluster, how many pods were bound (a bind with no room left is refused and not counted), and
    its node names."""
    rng = random.Random(seed)
    state, names, _ = cluster(n_nodes, "bestfit", rng)
    bound = 0
    for i in range(n_nodes * pods_per_node):
        resources, annotations = rng.choice(SHAPES[:5])
        p = pod(-i - 1, resources, annotations, "bestfit")
        state.api.pods[p["metadata"]["name"]] = p
        node = names[i % n_nodes]
        bound += not state.bind("bench", p["metadata"]["name"], p["metadata"]["uid"], node)
    return state, bound, names


def server_build(state: ClusterState, builds: int) -> dict[str, Any]:
    """Medians in milliseconds of one view build (cluster_view), its JSON encoding and its gzip (at the
    level the dashboard uses), wall and CPU; the sizes of the last body, plain and gzipped."""
    wall: dict[str, list[float]] = {"view": [], "encode": [], "gzip": [], "cpu": []}
    body = zipped = b""
    for _ in range(builds):
        cpu_start = time.thread_time()
        t0 = time.perf_counter()
        view = cluster_view(state)
        t1 = time.perf_counter()
        body = wire.encode(view)
        t2 = time.perf_counter()
        zipped = gzip.compress(body, GZIP_LEVEL, mtime=0)
        t3 = time.perf_counter()
        wall["cpu"].append((time.thread_time() - cpu_start) * 1e3)
        for key, took in (("view", t1 - t0), ("encode", t2 - t1), ("gzip", t3 - t2)):
            wall[key].append(took * 1e3)
    return {**{k: statistics.median(v) for k, v in wall.items()}, "bytes": len(body), "gzipped": len(zipped)}


def browser_loads(url: str, loads: int) -> list[float]:
    """Milliseconds from navigation start to the map drawn, one per fresh load of the page."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="gpuslice-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-dev-shm-usage", "--window-size=1366,768",
                f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    mark = "const m = performance.getEntriesByName('map-rendered'); return m.length ? m[0].startTime : null"
    times: list[float] = []
    try:
        for _ in range(loads + 1):  # the first load warms the browser's caches and is not counted
            time.sleep(VIEW_MAX_AGE_S + 0.1)  # the extender builds a fresh view for this load
            driver.get("about:blank")
            driver.get(url)
            deadline = time.monotonic() + 60
            while (took := driver.execute_script(mark)) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("the map was not drawn within 60 s")
                time.sleep(0.02)
            times.append(float(took))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return times[1:]


def filter_latency(
    port: int,
    names: list[str],
    rounds: int,
    seed: int,
    path: str = "/cluster/view.json",
    every_s: float = VIEW_MAX_AGE_S,
) -> dict[bool, list[float]]:
    """Milliseconds of one pod's POST /filter + /prioritize over HTTP (as benchmarks/extender.py's
    rounds, without its binds), by whether a dashboard page was asking for view.json every second (each
    ask a fresh build: the most the extender does for any number of pages). The rounds run in blocks of
    ``BLOCK_ROUNDS``, the page open in every other one, so both see the same drift of a shared machine.
    ``path`` and ``every_s``: another GET asked as often instead (benchmarks/cluster_metrics.py: /metrics,
    back to back)."""
    import httpx

    rng = random.Random(seed)
    page_open, stop = threading.Event(), threading.Event()

    def page() -> None:
        with httpx.Client(base_url=f"http://localhost:{port}", timeout=30) as http:
            while not stop.is_set():
                if page_open.is_set():
                    http.get(path)
                    stop.wait(every_s)
                else:
                    stop.wait(0.01)

    poller = threading.Thread(target=page, daemon=True)
    poller.start()
    took: dict[bool, list[float]] = {False: [], True: []}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for i in range(-20, 2 * rounds):  # the first 20 warm the verdict caches and are not counted
                opened = i >= 0 and (i // BLOCK_ROUNDS) % 2 == 1
                if opened:
                    page_open.set()
                else:
                    page_open.clear()
                resources, annotations = rng.choice(SHAPES)
                p = pod(i, resources, annotations, "bestfit")
                start = time.perf_counter()
                passed = http.post("/filter", json={"Pod": p, "Nodes": None, "NodeNames": names}).json()
                http.post("/prioritize", json={"Pod": p, "Nodes": None, "NodeNames": passed["NodeNames"]})
                if i >= 0:
                    took[opened].append((time.perf_counter() - start) * 1e3)
    finally:
        stop.set()
        poller.join()
    return took


def serve(app: Any) -> tuple[uvicorn.Server, int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return server, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="nodes of 8 GPUs")
    parser.add_argument("--pods-per-node", type=int, default=10)
    parser.add_argument("--loads", type=int, default=7, help="timed page loads (after one warm-up)")
    parser.add_argument("--builds", type=int, default=9, help="timed view builds")
    parser.add_argument(
        "--rounds", type=int, default=300, help="timed /filter + /prioritize rounds, each way"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "cluster_dashboard.md")
    args = parser.parse_args()

    started = time.perf_counter()
    state, bound, names = filled(args.nodes, args.pods_per_node, args.seed)
    print(f"cluster filled: {bound:,} pods bound in {time.perf_counter() - started:.0f} s", flush=True)
    build = server_build(state, args.builds)
    print(build, flush=True)
    server, port = serve(create_app(state))
    try:
        loads = browser_loads(f"http://localhost:{port}/cluster/", args.loads)
        took = filter_latency(port, names, args.rounds, args.seed)
    finally:
        server.should_exit = True
    pct = {
        (key, q): float(np.percentile(values, q))
        for key, values in (("alone", took[False]), ("beside", took[True]))
        for q in (50, 90, 99)
    }
    load = os.getloadavg()
    command = (
        f"`.venv/bin/python benchmarks/cluster_dashboard.py --nodes {args.nodes} "
        f"--pods-per-node {args.pods_per_node} --loads {args.loads} --builds {args.builds} "
        f"--rounds {args.rounds}`"
    )
    rows = [
        f"| {args.nodes:,} | {args.nodes * 8:,} | {bound:,} | {build['bytes'] / 1e6:.2f} MB "
        f"| {build['gzipped'] / 1e6:.2f} MB | {build['view']:.0f} | {build['encode']:.0f} "
        f"| {build['gzip']:.0f} | {build['cpu']:.0f} "
        f"| {statistics.median(loads):.0f} | {min(loads):.0f}-{max(loads):.0f} |"
    ]
    text = [
        "# Cluster dashboard (the extender's /cluster/)",
        "",
        f"Command: {command}",
        "",
        f"Machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        f"(1/5/15 min) when the run ended; {scheduling()}. "
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| nodes | GPUs | pods bound | view.json | gzipped | cluster_view ms | JSON ms | gzip ms "
        "| all three, CPU ms | load ms (median) | load ms (range) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "| dashboard | /filter + /prioritize p50 ms | p90 ms | p99 ms |",
        "|---|---:|---:|---:|",
        f"| none open | {pct['alone', 50]:.1f} | {pct['alone', 90]:.1f} | {pct['alone', 99]:.1f} |",
        f"| a view.json build every {VIEW_MAX_AGE_S:g} s "
        f"| {pct['beside', 50]:.1f} | {pct['beside', 90]:.1f} | {pct['beside', 99]:.1f} |",
        "",
        f"Server: medians of {args.builds} builds, called directly (no HTTP); gzip at level {GZIP_LEVEL}, "
        "as the extender sends it to a browser. "
        f"Load: navigation start -> the map drawn in headless Chromium, median of {len(loads)} loads "
        f"(each {VIEW_MAX_AGE_S:g} s after the last, so each waits for a fresh view): "
        + ", ".join(f"{t:.0f}" for t in loads)
        + " ms. "
        f"Scheduling beside it: {args.rounds} pods each way, POST /filter (all {args.nodes:,} node names) + "
        "POST /prioritize over HTTP to the same uvicorn (benchmarks/extender.py's shapes, no binds, 20 "
        f"warm-up rounds), in blocks of {BLOCK_ROUNDS} alternately without and with a page asking for "
        "view.json every second.",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(text) + "\n")
    print("\n".join(text))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
