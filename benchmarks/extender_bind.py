"""Scheduler extender bind latency under concurrent binds: C binds at once over the HTTP app, with the
node lock on, against a fake API server whose every call takes ``--api-ms``.

Each round: a fresh extender over ``--nodes`` nodes of 8 GPUs; C whole-GPU pods, each bound to a node
drawn at random, all POST /bind at once (httpx.AsyncClient over httpx.ASGITransport: the FastAPI app
in-process, its bind handlers on Starlette's worker threads, 40 of them, as in production). A node's
lock is taken at bind and released by a simulated device plugin ``--allocate-ms`` after the Binding
(its Allocate); a negative value never releases it (a pod the kubelet never admits), so every other bind
on that node waits for the lock until its wait runs out. Reported: wall time of each bind from the
client (p50, p99, max), and how many answered an error (kube-scheduler retries those).

    .venv/bin/python benchmarks/extender_bind.py                     # 50 binds, 10 nodes, 5 rounds
    .venv/bin/python benchmarks/extender_bind.py --allocate-ms -1    # locks never released
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx
import numpy as np

from gpuslice.k8s.annotations import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_NODE_INVENTORY,
    BIND_PHASE_ALLOCATED,
    InventoryGpu,
    NodeInventory,
)
from gpuslice.k8s.extender import ClusterState, WatchEvent, create_app
from gpuslice.k8s.node_lock import NodeLockConflict, release


class FakeApi:
    """Pods, per-node annotations with a resourceVersion (a stale write gets the 409), Bindings; every
    call sleeps ``delay_s``. ``allocate_s`` >= 0: the device plugin's Allocate after each Binding."""

    def __init__(self, delay_s: float, allocate_s: float) -> None:
        self.delay_s, self.allocate_s = delay_s, allocate_s
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, tuple[dict[str, str], int]] = {}
        self.state: ClusterState | None = None
        self._lock = threading.Lock()

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        time.sleep(self.delay_s)
        with self._lock:
            return self.pods[(namespace, name)]

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        time.sleep(self.delay_s)
        with self._lock:
            pod = self.pods[(namespace, name)]
            pod["metadata"]["annotations"] = {**pod["metadata"]["annotations"], **annotations}

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        time.sleep(self.delay_s)
        if self.allocate_s >= 0:
            threading.Timer(self.allocate_s, self._allocate, (namespace, name, uid, node)).start()

    def _allocate(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.patch_pod_annotations(namespace, name, {ANNOTATION_BIND_PHASE: BIND_PHASE_ALLOCATED})
        release(self, node, uid)
        assert self.state is not None and self.state.bind_locks is not None
        self.state.bind_locks.changed(node)  # what the Node watch event does

    def create_event(self, *args: Any) -> None:
        pass

    def pod_gone(self, namespace: str, name: str, uid: str) -> bool:
        return False

    def read_node_annotations(self, node_name: str) -> tuple[dict[str, str], str]:
        time.sleep(self.delay_s)
        with self._lock:
            annotations, version = self.nodes.get(node_name, ({}, 1))
            return dict(annotations), str(version)

    def write_node_annotations(
        self, node_name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> None:
        time.sleep(self.delay_s)
        with self._lock:
            current, version = self.nodes.get(node_name, ({}, 1))
            if resource_version != str(version):
                raise NodeLockConflict("409 Conflict")
            merged = {**current, **{k: v for k, v in annotations.items() if v is not None}}
            for key in [k for k, v in annotations.items() if v is None]:
                merged.pop(key, None)
            self.nodes[node_name] = (merged, version + 1)


def inventory() -> str:
    gpus = tuple(InventoryGpu(i, f"GPU-{i:02d}", "A100-80GB", 81920) for i in range(8))
    return NodeInventory(gpus=gpus, split_count=10).to_json()


async def one_round(args: argparse.Namespace, seed: int) -> tuple[list[float], int]:
    api = FakeApi(args.api_ms / 1000, args.allocate_ms / 1000)
    state = ClusterState(api, default_policy="bestfit", lock_timeout_s=300.0)
    api.state = state
    names = [f"n{i}" for i in range(args.nodes)]
    for name in names:
        meta = {"name": name, "annotations": {ANNOTATION_NODE_INVENTORY: inventory()}}
        state.apply(WatchEvent("Node", "ADDED", {"metadata": meta}))
    rng = random.Random(seed)
    bodies = []
    for i in range(args.binds):
        meta = {"name": f"p{i}", "namespace": "bench", "uid": f"uid-{seed}-{i}", "annotations": {}}
        limits = {"gpuslice.io/gpu": "1"}
        spec = {"containers": [{"name": "c", "resources": {"limits": limits, "requests": limits}}]}
        api.pods[("bench", f"p{i}")] = {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}
        bodies.append({"PodName": f"p{i}", "PodNamespace": "bench", "PodUID": meta["uid"],
                       "Node": rng.choice(names)})  # fmt: skip
    transport = httpx.ASGITransport(app=create_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender", timeout=60) as http:

        async def bind(body: dict[str, str]) -> tuple[float, str]:
            start = time.perf_counter()
            reply = await http.post("/bind", json=body)
            return time.perf_counter() - start, reply.json()["Error"]

        results = await asyncio.gather(*(bind(b) for b in bodies))
    return [t for t, _ in results], sum(1 for _, e in results if e)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binds", type=int, default=50, help="concurrent binds per round (default 50)")
    parser.add_argument("--nodes", type=int, default=10, help="nodes of 8 GPUs (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each a fresh extender (default 5)")
    parser.add_argument("--api-ms", type=float, default=10.0, help="time of each API call (default 10)")
    parser.add_argument(
        "--allocate-ms", type=float, default=50.0,
        help="Allocate this long after a Binding releases the node lock; negative: never (default 50)",
    )  # fmt: skip
    args = parser.parse_args()
    times: list[float] = []
    errors = 0
    for r in range(args.rounds):
        t, e = asyncio.run(one_round(args, r))
        times += t
        errors += e
    ms = np.array(times) * 1000
    print(
        f"{args.binds} concurrent binds x {args.rounds} rounds, {args.nodes} nodes, API {args.api_ms:g} ms, "
        f"Allocate {args.allocate_ms:g} ms: p50 {np.percentile(ms, 50):.0f} ms, p99 "
        f"{np.percentile(ms, 99):.0f} ms, max {ms.max():.0f} ms; {errors}/{len(ms)} answered an error"
    )
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
