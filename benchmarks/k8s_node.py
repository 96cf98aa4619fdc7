"""The real node of the end-to-end tests, measured: the upstream kubelet with containerd and runc, the
real ``gpuslice k8s device-plugin`` (four simulated L4s, the native shim), kube-scheduler deciding
through the gpuslice extender.

* pod start latency: ``--pods`` share pods (100 MiB and a share each) created one after another as
  fast as the API server takes them; per pod, create call -> first seen Running (the pod list is polled
  every 0.25 s), p50 / p99 / max, and the wall time until all run; pods the kubelet rejects (Allocate
  refused) are counted, with the first one's message;
* kubelet restart recovery with those pods running: the kubelet stopped (SIGTERM) and started again;
  seconds until its health endpoint answers, until the device plugin has registered again, and until
  the Node reports the shares allocatable again; every pod still Running in the same container;
* the node lock (one pod at a time from bind to Allocate): how long each pod held it, sampled;
* the compute share two pods at 30 % and 70 % of one GPU, created together, measure from inside their
  containers (``driver_client launch``: busy time of the fake GPU / wall time), ``--share-runs`` times.

    scripts/k8s-e2e --co -q >/dev/null   # builds the binaries, the kubelet included
    GPUSLICE_K8S_BIN=~/.cache/gpuslice-e2e/<key>/bin .venv/bin/python benchmarks/k8s_node.py --pods 200

Results go to benchmarks/out/k8s_node.json. One node per machine (the kubelet's device-plugin socket
is at a fixed path); run as root.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "k8s_e2e"), str(REPO / "e2e" / "k8s")]  # the node tests' harness

from controlplane import ControlPlane, binaries_dir, free_port  # noqa: E402
from e2e_helpers import scheduler_config, start_extender, wait_for  # noqa: E402
from kubelet_node_helpers import (  # noqa: E402
    NODE_NAME,
    allocatable,
    node_pod,
    pod_log,
    start_device_plugin,
    start_node,
    wait_phase,
)

GPU = "gpuslice.io/gpu"
POLL_S = 0.25
LOCK_POLL_S = 0.1


def _core(plane: ControlPlane) -> Any:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=cfg)
    return client.CoreV1Api(client.ApiClient(cfg))


def _namespace(core: Any, name: str) -> str:
    from kubernetes import client

    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


class LockWatch:
    """Samples the node's gpuslice.io/node-lock every LOCK_POLL_S: how long each pod held it (bind to
    Allocate), to 0.1 s; pods held for less than one sample are not seen."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.seen: dict[str, list[float]] = {}  # holder uid -> [first seen, last seen]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from gpuslice.k8s.node_lock import ANNOTATION_NODE_LOCK, parse_holders

        while not self._stop.wait(LOCK_POLL_S):
            try:
                node = self.core.read_node(NODE_NAME)
            except Exception:
                continue
            now = time.monotonic()
            for holder in parse_holders((node.metadata.annotations or {}).get(ANNOTATION_NODE_LOCK)):
                self.seen.setdefault(holder.uid, [now, now])[1] = now

    def summary(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=5)
        held = np.array([last - first + LOCK_POLL_S for first, last in self.seen.values()] or [0.0])
        return {
            "holders_seen": len(self.seen),
            "hold_p50_s": round(float(np.percentile(held, 50)), 2),
            "hold_p99_s": round(float(np.percentile(held, 99)), 2),
            "hold_max_s": round(float(held.max()), 2),
        }


def pod_start_latency(core: Any, namespace: str, count: int) -> dict[str, Any]:
    resources = {GPU: 1, "gpuslice.io/gpumem": 100, "gpuslice.io/gpucores": 1}
    created: dict[str, float] = {}
    running: dict[str, float] = {}
    locks = LockWatch(core)
    start = time.monotonic()
    for i in range(count):
        name = f"p{i:04d}"
        core.create_namespaced_pod(namespace, node_pod(name, "sleep 3600", resources=resources))
        created[name] = time.monotonic()
        if i % 20 == 19:
            print(f"  created {i + 1}/{count}", file=sys.stderr)
    failed: dict[str, str] = {}  # pods the kubelet rejected: name -> its message
    deadline = time.monotonic() + 30 * 60
    while len(running) + len(failed) < count and time.monotonic() < deadline:
        now = time.monotonic()
        for pod in core.list_namespaced_pod(namespace).items:
            if pod.status.phase == "Running" and pod.metadata.name not in running:
                running[pod.metadata.name] = now
            elif pod.status.phase in ("Failed", "Succeeded") and pod.metadata.name not in failed:
                failed[pod.metadata.name] = f"{pod.status.reason}: {pod.status.message}"
        print(f"  running {len(running)}/{count}, failed {len(failed)}", file=sys.stderr)
        time.sleep(POLL_S)
    latency = np.array([running[n] - created[n] for n in running])
    return {
        "pods": count,
        "running": len(running),
        "pods_per_s": round(len(running) / (max(running.values()) - start), 2) if running else 0.0,
        "p50_s": round(float(np.percentile(latency, 50)), 2),
        "p99_s": round(float(np.percentile(latency, 99)), 2),
        "max_s": round(float(latency.max()), 2),
        "all_running_s": round(max(running.values()) - start, 1),
        "failed": len(failed),
        "failed_first": next(iter(failed.values()), ""),
        "node_lock": locks.summary(),
    }


def _containers(core: Any, namespace: str) -> dict[str, str]:
    """Running pod -> its container's ID."""
    pods = core.list_namespaced_pod(namespace).items
    return {
        p.metadata.name: p.status.container_statuses[0].container_id
        for p in pods
        if p.status.phase == "Running"
    }


def kubelet_restart(core: Any, node: Any, plugin: Any, namespace: str) -> dict[str, Any]:
    assert plugin.proc is not None
    registered = plugin.proc.tail(10_000).count(f"registered {GPU}")
    shares = allocatable(core, GPU)
    containers = _containers(core, namespace)
    node.stop_kubelet()
    start = time.monotonic()
    node.start_kubelet()  # returns once /healthz answers
    healthy = time.monotonic() - start
    wait_for(lambda: plugin.proc.tail(10_000).count(f"registered {GPU}") > registered, 300, "re-registration")
    reregistered = time.monotonic() - start
    # the kubelet drops the plugin's devices on restart; they are back when it reports them again
    wait_for(lambda: allocatable(core, GPU) == shares, 300, "the shares again")
    back = time.monotonic() - start
    after = _containers(core, namespace)
    return {
        "pods_running": len(containers),
        "healthz_s": round(healthy, 2),
        "plugin_registered_s": round(reregistered, 2),
        "shares_allocatable_s": round(back, 2),
        "same_containers": after == containers,
    }


def shares(core: Any, node: Any, namespace: str, runs: int) -> list[dict[str, float]]:
    measured = []
    for run in range(runs):
        names = {}
        for cores in (30, 70):  # both at once: the node lock lets one at a time from bind to Allocate
            name = f"share-{cores}-{run}"
            resources = {GPU: 1, "gpuslice.io/gpumem": 1000, "gpuslice.io/gpucores": cores}
            core.create_namespaced_pod(
                namespace, node_pod(name, "driver_client launch kernel 1500 1000", resources=resources)
            )
            names[cores] = name
        row = {}
        for cores, name in names.items():
            wait_phase(core, namespace, name, ("Succeeded",), 300)
            log = pod_log(node, core, namespace, name)
            values = dict(line.split(" ", 1) for line in log.splitlines() if " " in line)
            row[f"share_{cores}"] = round(float(values["share"]), 4)
        print(f"  shares run {run + 1}: {row}", file=sys.stderr)
        measured.append(row)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=200, help="share pods for the start latency")
    parser.add_argument("--share-runs", type=int, default=3, help="30/70 pairs to measure")
    parser.add_argument(
        "--start-only", action="store_true", help="measure the pod starts only (no restart, no 30/70 pairs)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out" / "k8s_node.json")
    args = parser.parse_args()
    if args.pods < 1 or args.share_runs < 1:
        parser.error("--pods and --share-runs must be at least 1")
    folder = binaries_dir()
    if folder is None or not (folder / "kubelet").is_file():
        parser.error("set GPUSLICE_K8S_BIN to the binaries scripts/k8s-e2e built (the kubelet among them)")
    plane = ControlPlane(folder)
    node = plugin = None
    try:
        plane.start()
        core = _core(plane)
        _namespace(core, "gpuslice")  # kube-scheduler's leader-election lease lives there
        port = free_port()
        start_extender(plane, port, "--policy", "bestfit")
        plane.start_scheduler(scheduler_config(port))
        print("starting the node ...", file=sys.stderr)
        node = start_node(plane, core)
        split = max(10, -(-args.pods // 4))  # enough shares on four GPUs for every pod at once
        plugin = start_device_plugin(plane, core, split_count=split)
        results: dict[str, Any] = {"load_before": os.getloadavg()[0]}
        print(f"{args.pods} share pods ...", file=sys.stderr)
        results["pod_start"] = pod_start_latency(core, _namespace(core, "bench-start"), args.pods)
        if args.start_only:
            return finish(args.out, results)
        print("kubelet restart ...", file=sys.stderr)
        results["kubelet_restart"] = kubelet_restart(core, node, plugin, "bench-start")
        core.delete_collection_namespaced_pod("bench-start", grace_period_seconds=0)
        wait_for(lambda: not core.list_namespaced_pod("bench-start").items, 600, "the pods to go")
        print("30 / 70 shares ...", file=sys.stderr)
        results["shares_30_70"] = shares(core, node, _namespace(core, "bench-share"), args.share_runs)
        results["load_after"] = os.getloadavg()[0]
    finally:
        if plugin is not None:
            plugin.stop()
        if node is not None:
            node.stop()
        plane.stop()
    finish(args.out, results)


def finish(out: Path, results: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
