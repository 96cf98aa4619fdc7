"""Scheduler extender latency as kube-scheduler sees it: the extender in its own process behind uvicorn on
a localhost socket, the client in another, request bodies encoded before the clock starts and replies
decoded after it stops (kube-scheduler does that JSON work in Go; the in-process benchmark
`benchmarks/extender.py` charges it to the round in Python). Same cluster, pod shapes, fill level and
one bind between rounds as that benchmark. Target: filter + prioritize p99 under 20 ms at 5,000
nodes of 8 GPUs.

Besides the wall time of each round it records CPU time on both sides, which other work on a shared
machine barely changes: the server's (thread CPU time inside the ASGI app for the round's /filter and
/prioritize: reading the body, the extender, writing the reply) and the client's (its thread CPU time
in the two calls: sending, receiving, HTTP framing; no JSON). The uvicorn server is started with the
same options as ``gpuslice k8s extender`` (``extender.SERVER_OPTIONS``); ``--http h11 --loop asyncio``
measures uvicorn's pure-Python defaults instead.

Clients: ``stdlib`` (http.client, one keep-alive connection: little framing work, the nearest Python
gets to kube-scheduler's Go client) or ``httpx`` (what the first measurement used; its HTTP framing of
100 kB bodies costs a few ms per call in the client process, see RESULTS.md).

    .venv/bin/python benchmarks/extender_socket.py                 # 1,000 and 5,000 nodes, bestfit and fgd
    .venv/bin/python benchmarks/extender_socket.py --nodes 5000 --client httpx
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import random
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extender import SHAPES, NullApi, cluster, pod, scheduling
from gpuslice.k8s.extender import SERVER_OPTIONS

CPU_PATH = "/_benchmark/server-cpu"  # served by the benchmark's wrapper, not by the extender
JSON_HEADERS = {"content-type": "application/json"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _go_json(value: Any) -> bytes:
    """JSON as kube-scheduler's Go encoding/json writes it: compact, fields in declaration order."""
    return json.dumps(value, separators=(",", ":")).encode()


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


def _with_server_cpu(app: Any) -> Any:
    """The extender app, timing the thread CPU of each /filter and /prioritize; GET CPU_PATH lists them."""
    cpu_ms: list[float] = []

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == CPU_PATH:
            body = json.dumps(cpu_ms).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        start = time.thread_time()
        await app(scope, receive, send)
        if scope["type"] == "http" and scope["path"] in ("/filter", "/prioritize"):
            cpu_ms.append((time.thread_time() - start) * 1e3)

    return timed


def _serve(n_nodes: int, policy: str, rounds: int, seed: int, port: int, options: dict[str, Any]) -> None:
    import uvicorn

    from gpuslice.k8s.extender import create_app

    state, _ = cluster(n_nodes, policy, random.Random(seed))
    assert isinstance(state.api, NullApi)
    for p in _round_pods(n_nodes, policy, rounds, seed, state):
        state.api.pods[p["metadata"]["name"]] = p
    app = _with_server_cpu(create_app(state))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", **options)


def _stdlib_post(port: int) -> tuple[Callable[[str, bytes], bytes], Callable[[], None]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.connect()
    # Go's net/http (kube-scheduler) sets TCP_NODELAY on every connection; http.client does not, and
    # Nagle would hold the end of each 100 kB body back until the server's delayed ACK.
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(path: str, body: bytes) -> bytes:
        connection.request("POST", path, body=body, headers=JSON_HEADERS)
        reply = connection.getresponse()
        data = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"POST {path}: HTTP {reply.status} {data[:200]!r}")
        return data

    return post, connection.close


def _httpx_post(port: int) -> tuple[Callable[[str, bytes], bytes], Callable[[], None]]:
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def post(path: str, body: bytes) -> bytes:
        return client.post(path, content=body, headers=JSON_HEADERS).raise_for_status().content

    return post, client.close


CLIENTS = {"stdlib": _stdlib_post, "httpx": _httpx_post}


def _wait_for(port: int, server: mp.process.BaseProcess) -> None:
    for _ in range(1200):  # the server builds and fills the cluster first
        if not server.is_alive():
            raise SystemExit(f"the extender exited with code {server.exitcode}")
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as probe:
                if probe.get("/healthz").status_code == 200:
                    return
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit("the extender did not start in 2 minutes")


def measure(
    n_nodes: int, policy: str, rounds: int, seed: int, client: str, options: dict[str, Any], drop: float
) -> dict[str, float]:
    port = _free_port()
    server = mp.get_context("spawn").Process(
        target=_serve, args=(n_nodes, policy, rounds, seed, port, options)
    )
    server.start()
    names = [f"gpu-node-{i:05d}" for i in range(n_nodes)]
    pods = _round_pods(n_nodes, policy, rounds, seed)
    wall: list[float] = []
    client_cpu: list[float] = []
    try:
        _wait_for(port, server)
        post, close = CLIENTS[client](port)
        try:
            dropper = random.Random(seed + 1)
            for i, p in enumerate(pods):
                asked = [n for n in names if dropper.random() >= drop] if drop else names
                body = _go_json({"Pod": p, "Nodes": None, "NodeNames": asked})
                cpu, start = time.thread_time(), time.perf_counter()
                raw = post("/filter", body)
                filter_s, filter_cpu = time.perf_counter() - start, time.thread_time() - cpu
                passed = json.loads(raw)["NodeNames"]
                body = _go_json({"Pod": p, "Nodes": None, "NodeNames": passed})
                cpu, start = time.thread_time(), time.perf_counter()
                raw = post("/prioritize", body)
                prioritize_s, prioritize_cpu = time.perf_counter() - start, time.thread_time() - cpu
                if i >= 20:
                    wall.append((filter_s + prioritize_s) * 1e3)
                    client_cpu.append((filter_cpu + prioritize_cpu) * 1e3)
                if passed:
                    best = max(json.loads(raw), key=lambda h: h["Score"])["Host"]
                    meta = p["metadata"]
                    bind = {
                        "PodName": meta["name"],
                        "PodNamespace": "bench",
                        "PodUID": meta["uid"],
                        "Node": best,
                    }
                    post("/bind", _go_json(bind))
        finally:
            close()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as probe:
            calls = probe.get(CPU_PATH).json()
    finally:
        server.terminate()
        server.join()
    server_cpu = [f + p for f, p in zip(calls[::2], calls[1::2], strict=True)][20:]
    return {
        f"{name}_{q}": float(np.percentile(values, q))
        for name, values in (("wall", wall), ("server", server_cpu), ("client", client_cpu))
        for q in (50, 99)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000", help="comma list of cluster sizes (nodes of 8 GPUs)")
    parser.add_argument("--policies", default="bestfit,fgd", help="comma list of placement policies")
    parser.add_argument("--rounds", type=int, default=300, help="timed pods per size and policy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--client", choices=sorted(CLIENTS), default="stdlib", help="HTTP client (see above)")
    parser.add_argument(
        "--drop",
        type=float,
        default=0.0,
        help="fraction of nodes left out of each pod's /filter list at random, as kube-scheduler's in-tree "
        "filters would (default 0: every pod gets the same list)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "extender_socket.md")
    parser.add_argument("--http", choices=["httptools", "h11"], default=SERVER_OPTIONS["http"])
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default=SERVER_OPTIONS["loop"])
    args = parser.parse_args()
    options = {**SERVER_OPTIONS, "http": args.http, "loop": args.loop}
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        for policy in args.policies.split(","):
            before = os.getloadavg()[0]
            r = measure(n, policy, args.rounds, args.seed, args.client, options, args.drop)
            after = os.getloadavg()[0]
            rows.append(
                f"| {n:,} | {n * 8:,} | {policy} | {r['wall_50']:.2f} | {r['wall_99']:.2f} "
                f"| {r['server_50']:.2f} | {r['server_99']:.2f} "
                f"| {r['client_50']:.2f} | {r['client_99']:.2f} "
                f"| {before:.1f} → {after:.1f} |"
            )
            print(rows[-1], flush=True)
    text = "\n".join([
        "# Scheduler extender latency over a socket",
        "",
        f"Command: `.venv/bin/python benchmarks/extender_socket.py --nodes {args.nodes} "
        f"--policies {args.policies} --rounds {args.rounds} --client {args.client} "
        f"--http {args.http} --loop {args.loop} --drop {args.drop}`",
        "",
        "Extender in its own process (uvicorn, 127.0.0.1), client in another; bodies encoded before and",
        "replies decoded after the clock. Milliseconds for one pod's POST /filter + POST /prioritize:",
        "wall time, the server's CPU time and the client's CPU time for the same round.",
        f"Machine: {os.cpu_count()} CPUs; 1-minute load average before → after each row; {scheduling()}.",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| nodes | GPUs | policy | wall p50 | wall p99 | server CPU p50 | server CPU p99 "
        "| client CPU p50 | client CPU p99 | load |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
        *rows,
    ])  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
