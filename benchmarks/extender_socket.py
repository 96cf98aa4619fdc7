"""Scheduler extender latency as kube-scheduler sees it: the extender in its own process behind uvicorn on
a localhost socket, the client in another, request bodies encoded before the clock starts and replies
decoded after it stops (kube-scheduler does that JSON work in Go; the in-process benchmark
`benchmarks/extender.py` charges it to the round in Python). Same cluster, pod shapes, fill level and
one bind between rounds as that benchmark. Target (issue 6): filter + prioritize p99 under 20 ms at 5,000
nodes of 8 GPUs.

    .venv/bin/python benchmarks/extender_socket.py                 # 1,000 and 5,000 nodes, bestfit and fgd
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import socket
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extender import SHAPES, NullApi, cluster, pod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _round_pods(n_nodes: int, policy: str, rounds: int, seed: int, state=None) -> list[dict]:
    """The fill (bound straight into ``state`` when given) and then the timed rounds' pods, from ``seed``."""
    rng = random.Random(seed)
    for i in range(n_nodes * 3):
        resources, annotations = rng.choice(SHAPES[:5])
        node = rng.randrange(n_nodes)
        if state is not None:
            p = pod(-i - 1, resources, annotations, policy)
            state.api.pods[p["metadata"]["name"]] = p
            state.bind("bench", p["metadata"]["name"], p["metadata"]["uid"], f"gpu-node-{node:05d}")
    return [pod(i, *rng.choice(SHAPES), policy) for i in range(rounds + 20)]


def _serve(n_nodes: int, policy: str, rounds: int, seed: int, port: int) -> None:
    import uvicorn

    from gpuslice.k8s.extender import create_app

    state, _ = cluster(n_nodes, policy, random.Random(seed))
    assert isinstance(state.api, NullApi)
    for p in _round_pods(n_nodes, policy, rounds, seed, state):
        state.api.pods[p["metadata"]["name"]] = p
    uvicorn.run(create_app(state), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def measure(n_nodes: int, policy: str, rounds: int, seed: int) -> dict[str, float]:
    port = _free_port()
    server = mp.get_context("spawn").Process(target=_serve, args=(n_nodes, policy, rounds, seed, port))
    server.start()
    names = [f"gpu-node-{i:05d}" for i in range(n_nodes)]
    pods = _round_pods(n_nodes, policy, rounds, seed)
    headers = {"content-type": "application/json"}
    totals: list[float] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for _ in range(600):  # wait for the server (it builds the cluster first)
                try:
                    http.get("/openapi.json")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            for i, p in enumerate(pods):
                body = json.dumps({"Pod": p, "Nodes": None, "NodeNames": names}).encode()
                start = time.perf_counter()
                raw = http.post("/filter", content=body, headers=headers).content
                filter_s = time.perf_counter() - start
                passed = json.loads(raw)["NodeNames"]
                body = json.dumps({"Pod": p, "Nodes": None, "NodeNames": passed}).encode()
                start = time.perf_counter()
                raw = http.post("/prioritize", content=body, headers=headers).content
                prioritize_s = time.perf_counter() - start
                if i >= 20:
                    totals.append((filter_s + prioritize_s) * 1e3)
                if passed:
                    best = max(json.loads(raw), key=lambda h: h["Score"])["Host"]
                    meta = p["metadata"]
                    http.post("/bind", json={"PodName": meta["name"], "PodNamespace": "bench",
                                             "PodUID": meta["uid"], "Node": best})  # fmt: skip
    finally:
        server.terminate()
        server.join()
    return {"p50": float(np.percentile(totals, 50)), "p99": float(np.percentile(totals, 99))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000")
    parser.add_argument("--policies", default="bestfit,fgd")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "extender_socket.md")
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        for policy in args.policies.split(","):
            r = measure(n, policy, args.rounds, args.seed)
            rows.append(f"| {n:,} | {n * 8:,} | {policy} | {r['p50']:.2f} | {r['p99']:.2f} |")
            print(rows[-1], flush=True)
    load = os.getloadavg()
    text = "\n".join([
        "# Scheduler extender latency over a socket",
        "",
        f"Command: `.venv/bin/python benchmarks/extender_socket.py --nodes {args.nodes} "
        f"--policies {args.policies} --rounds {args.rounds}`",
        "",
        "Extender in its own process (uvicorn, 127.0.0.1), client in another; bodies encoded before and",
        "replies decoded after the clock. Milliseconds for one pod's POST /filter + POST /prioritize.",
        f"Machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}.",
        "",
        "| nodes | GPUs | policy | filter + prioritize p50 | p99 |",
        "|---:|---:|---|---:|---:|",
        *rows,
    ])  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
