"""openb through the real kube-scheduler via DRA: gpuslice deciding (pods gated, ``gpuslice k8s
dra-allocator`` allocates their claims) vs kube-scheduler's own DRA allocator deciding (pods ungated).

A node subset of the openb cluster (the first ``--nodes`` GPU nodes) publishes its pools as the DRA driver
does (``node_slices`` through ``DraApi.publish``: one shared device per GPU with consumable memory and
cores); a seeded sample of the default trace's GPU pods becomes one ResourceClaim each (a share:
``gpu.gpuslice.io`` with cores = milli-GPU / 10 and memory = the same fraction of the smallest GPU;
several or whole GPUs: ``whole-gpu.gpuslice.io``) and one pod, created in trace order. CPU and memory
requests are left out (the allocator's ledger holds GPUs only, as the extender's does).

Reports per mode: pods bound, pods/s (first create to last bind), unallocated GPU % (consumed cores read
back from the claims), create-to-bound latency p50/p99 (pods polled every 0.2 s) and kube-scheduler's
``scheduler_scheduling_algorithm_duration_seconds`` p50/p99. Sim parity: the same claims in the same
order through the allocator's ``Inventory`` offline (same placer, same policy), compared device by device
with what the gpuslice run stored. FGD-style policies get the trace's GPU workload as their target
(``--target-workload`` of the allocator, the same object offline), as ``gpuslice sim openb`` gives it
the trace's workload.

    GPUSLICE_K8S_BIN=~/.cache/gpuslice-e2e/<key>/bin .venv/bin/python benchmarks/dra_openb.py --pods 400
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e" / "k8s"))
sys.path.insert(0, str(REPO / "benchmarks"))

from controlplane import ControlPlane, binaries_dir  # noqa: E402

from gpuslice.hardware.machine import GpuInfo, Machine  # noqa: E402
from gpuslice.k8s.dra.allocator import GATE, Inventory  # noqa: E402
from gpuslice.k8s.dra.claim_ask import claim_ask  # noqa: E402
from gpuslice.k8s.dra.classes import CLASS_SHARED, CLASS_WHOLE, device_classes  # noqa: E402
from gpuslice.k8s.dra.kube import GROUP, VERSION, DraApi  # noqa: E402
from gpuslice.k8s.dra.slices import node_slices  # noqa: E402
from gpuslice.scheduler.placer import Unplaced  # noqa: E402
from gpuslice.sim.trace import TracePod, bundled_dir, load_target_workload, load_trace  # noqa: E402
from gpuslice.units import MiB  # noqa: E402
from gpuslice.workload.request import MILLI_PER_GPU  # noqa: E402
from k8s_e2e import fetch, histogram_quantiles, sample  # noqa: E402

SCHEDULER = "dra-bench"
TARGET_FILE = bundled_dir() / "openb_pod_list_default.csv"  # the trace the sample is drawn from
GPUSLICE = str(Path(sys.executable).parent / "gpuslice")


def claim_for(pod: TracePod, smallest_mib: int) -> dict[str, Any]:
    req = pod.request
    if req.num_gpu == 1 and req.gpu_milli < MILLI_PER_GPU:
        mib = max(256, math.ceil(smallest_mib * req.gpu_milli / MILLI_PER_GPU / 256) * 256)
        exactly: dict[str, Any] = {
            "deviceClassName": CLASS_SHARED,
            "count": 1,
            "capacity": {
                "requests": {"memory": f"{mib}Mi", "cores": str(max(1, math.ceil(req.gpu_milli / 10)))}
            },
        }
    else:
        exactly = {"deviceClassName": CLASS_WHOLE, "count": req.num_gpu}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": pod.name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod_for(name: str, gated: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        "containers": [{"name": "m", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        "terminationGracePeriodSeconds": 0,
    }
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def machines(nodes: list[Any]) -> list[Machine]:
    out = []
    for i, n in enumerate(nodes):
        memory = n.gpu_memory_bytes or 16 * 1024 * MiB
        gpus = tuple(GpuInfo(g, f"GPU-bench-{i:04d}-{g}", n.gpu_model, memory) for g in range(n.gpu_count))
        out.append(Machine(name=f"bench-{i:04d}", gpus=gpus))
    return out


def run_mode(
    bin_dir: Path, mode: str, ms: list[Machine], pods: list[TracePod], policy: str
) -> dict[str, Any]:
    from kubernetes import client, config

    plane = ControlPlane(bin_dir)
    plane.start()
    try:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=cfg)
        api_client = client.ApiClient(cfg)
        core = client.CoreV1Api(api_client)
        objects = client.CustomObjectsApi(api_client)
        dra = DraApi(client=api_client)
        for c in device_classes():
            objects.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", c)
        capacity = {"cpu": "256", "memory": "2Ti", "pods": "1000"}
        for m in ms:
            core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=m.name)))
            core.patch_node_status(m.name, {"status": {"capacity": capacity, "allocatable": capacity}})
            core.patch_node(m.name, {"spec": {"taints": None}})
            dra.publish(m.name, node_slices(m, m.name, generation=1))
        scheduler_config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": SCHEDULER, "pluginConfig": [], "percentageOfNodesToScore": 100}],
        }
        _proc, port = plane.start_scheduler(scheduler_config)
        if mode == "gpuslice":
            plane.spawn(
                "dra-allocator",
                [GPUSLICE, "k8s", "dra-allocator", "--kubeconfig", str(plane.kubeconfig),
                 "--policy", policy, "--target-workload", str(TARGET_FILE)],
            )  # fmt: skip
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="bench")))
        smallest = min(g.memory_bytes for m in ms for g in m.gpus) // MiB
        created: dict[str, float] = {}
        bound: dict[str, float] = {}
        start = time.monotonic()
        for p in pods:
            objects.create_namespaced_custom_object(
                GROUP, VERSION, "bench", "resourceclaims", claim_for(p, smallest)
            )
            core.create_namespaced_pod("bench", pod_for(p.name, mode == "gpuslice"))
            created[p.name] = time.monotonic()
        last_change = time.monotonic()
        while time.monotonic() - last_change < 20 and len(bound) < len(pods):
            now = time.monotonic()
            for item in core.list_namespaced_pod("bench").items:
                if item.spec.node_name and item.metadata.name not in bound:
                    bound[item.metadata.name] = now
                    last_change = now
            time.sleep(0.2)
        metrics = fetch(f"https://127.0.0.1:{port}/metrics")
        algo = histogram_quantiles(metrics, "scheduler_scheduling_algorithm_duration_seconds")
        claims = objects.list_namespaced_custom_object(GROUP, VERSION, "bench", "resourceclaims")["items"]
        used = 0
        placed: dict[str, list[tuple[str, str]]] = {}
        for c in claims:
            results = ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
            placed[c["metadata"]["name"]] = [(r["pool"], r["device"]) for r in results]
            for r in results:
                used += int(str(r.get("consumedCapacity", {}).get("cores", "100"))) * 10
        total = sum(m.gpu_count for m in ms) * MILLI_PER_GPU
        latency = np.array([bound[n] - created[n] for n in bound]) * 1000 if bound else np.array([np.nan])
        span = max(bound.values()) - start if bound else float("nan")
        return {
            "mode": mode,
            "bound": len(bound),
            "pods_per_s": len(bound) / span if bound else 0.0,
            "unallocated_pct": 100 * (1 - used / total),
            "latency": (float(np.percentile(latency, 50)), float(np.percentile(latency, 99))),
            "algorithm": algo,
            "placed": placed,
            "slices": dra.list_slices(),
            "claims": {c["metadata"]["name"]: c for c in claims},
        }
    finally:
        plane.stop()


def sim_parity(run: dict[str, Any], pods: list[TracePod], ms: list[Machine], policy: str) -> tuple[int, int]:
    """Same claims, same order, same placer offline: how many land on the same node and devices."""
    inventory = Inventory(run["slices"], [], policy, target=load_target_workload(TARGET_FILE))
    same = 0
    smallest = min(g.memory_bytes for m in ms for g in m.gpus) // MiB
    for p in pods:
        ask = claim_ask(claim_for(p, smallest))
        assert ask is not None
        decision = inventory.place(ask, None)
        got = sorted(run["placed"].get(p.name, []))
        if isinstance(decision, Unplaced):
            same += not got
            continue
        same += sorted((decision.node, g.device) for g in decision.gpus) == got
    return same, len(pods)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--policy", default="bestfit")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--modes", default="gpuslice,kube")
    args = parser.parse_args()
    bin_dir = binaries_dir()
    if bin_dir is None:
        sys.exit("error: set GPUSLICE_K8S_BIN to the folder scripts/k8s-e2e built")
    trace = load_trace()
    nodes = [n for n in trace.nodes if 0 < n.gpu_count <= 8][: args.nodes]
    ms = machines(nodes)
    pods = [
        TracePod(f"p{k:05d}", p.request)
        for k, p in enumerate(sample(tuple(p for p in trace.pods if p.request.num_gpu), args.pods, args.seed))
    ]
    print(f"{len(ms)} nodes, {sum(m.gpu_count for m in ms)} GPUs, {len(pods)} GPU pods, policy {args.policy}")
    print("| mode | bound | pods/s | unallocated GPU % | create-to-bound p50 / p99 ms", end="")
    print(" | algorithm p50 / p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in args.modes.split(","):
        run = run_mode(bin_dir, mode, ms, pods, args.policy)
        (l50, l99), (a50, a99) = run["latency"], run["algorithm"]
        print(
            f"| {mode} | {run['bound']}/{len(pods)} | {run['pods_per_s']:.1f} | {run['unallocated_pct']:.2f} "
            f"| {l50:.0f} / {l99:.0f} | {a50:.1f} / {a99:.1f} |",
            flush=True,
        )
        if mode == "gpuslice":
            same, n = sim_parity(run, pods, ms, args.policy)
            print(
                f"sim parity (gpuslice run vs the same Inventory offline): {same}/{n} same node and devices"
            )


if __name__ == "__main__":
    main()
