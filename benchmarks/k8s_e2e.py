"""The openb default trace through a real kube-scheduler: with the gpuslice extender deciding (FGD,
bestfit) and with kube-scheduler's own scoring choosing among the nodes the extender's filter passes
("default"). The full 1,213-node cluster as Node objects; a seeded sample of the trace's GPU pods,
created one after another as fast as the API server takes them.

Per mode it reports the unallocated GPU % when every pod has been placed or given up on, pods bound per
second (first create to last bind), and latency as the two processes report it: kube-scheduler's own
``scheduling_algorithm_duration_seconds`` (filtering and scoring, the extender's filter and prioritize
calls included; kube-scheduler has no per-extender histogram) and the extender's
``gpuslice_extender_request_duration_seconds`` by verb, p50 and p99 from the histogram buckets.

Each GPU node has the real device plugin (``DevicePlugin``, the code the node's DaemonSet runs, with
this benchmark's share count and the node's GPUs) and a kubelet stand-in (``e2e/k8s/kubelet_standin.py``)
that calls its Allocate for each pod bound there, one pod at a time per node, ``--admission-ms`` after
hearing of the bind (what the real kubelet took in ``benchmarks/k8s_node.py``). Allocate releases the
node lock the extender's bind took, so pods on one node go through bind to Allocate one at a time, as
on a real cluster.

Cross-check with ``gpuslice sim``: the same pod sequence goes through the same ``Placer`` with the same
policy over a ledger that models what the extender models (GPUs only: CPU and memory are
kube-scheduler's NodeResourcesFit's, modelled by a second ledger that only filters) and the same FGD
target workload, and the pod -> node mappings are compared; differences are listed.

    scripts/k8s-e2e --co -q >/dev/null   # builds the binaries once (or run the e2e suite)
    GPUSLICE_K8S_BIN=~/.cache/gpuslice-e2e/<key>/bin .venv/bin/python benchmarks/k8s_e2e.py --pods 2000

CPU-only pods of the trace are left out: with gpuslice they are kube-scheduler's alone.
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e" / "k8s"))

from controlplane import ControlPlane, binaries_dir, free_port  # noqa: E402
from kubelet_standin import KubeletStandIn  # noqa: E402

from gpuslice.hardware.machine import GpuInfo, Machine  # noqa: E402
from gpuslice.hardware.node import NodeSpec  # noqa: E402
from gpuslice.k8s.annotations import ANNOTATION_NODE_INVENTORY, InventoryGpu, NodeInventory  # noqa: E402
from gpuslice.k8s.decision import Decision  # noqa: E402
from gpuslice.k8s.device_plugin import DevicePlugin, NodeKubeClient  # noqa: E402
from gpuslice.ledger.ledger import Ledger  # noqa: E402
from gpuslice.ledger.placement import Placement  # noqa: E402
from gpuslice.node.discovery import SIMULATED_UUID_PREFIX  # noqa: E402
from gpuslice.policies import PolicyContext, placement_policy  # noqa: E402
from gpuslice.scheduler.placer import Placer  # noqa: E402
from gpuslice.sim.trace import TracePod, bundled_dir, load_trace  # noqa: E402
from gpuslice.units import MiB  # noqa: E402
from gpuslice.workload.request import MILLI_PER_GPU, Request  # noqa: E402
from gpuslice.workload.target import TargetWorkload  # noqa: E402

SPLIT = 20  # shares per GPU: the trace's smallest share is 50 milli-GPU, so at most 20 pods per GPU
SETTLE_S = 20.0  # no new bind for this long once every pod was created: the rest stay pending
GPUSLICE = str(Path(sys.executable).parent / "gpuslice")


@dataclass
class Run:
    mode: str
    pods: int
    bound: int = 0
    wall_s: float = 0.0
    unallocated_pct: float = 0.0
    mapping: dict[str, str] = field(default_factory=dict)
    algorithm_ms: tuple[float, float] = (0.0, 0.0)
    extender_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    load: float = 0.0
    allocated: int = 0  # Allocate answered (the kubelet stand-in)
    refused: int = 0  # Allocate refused: the pod failed admission
    binds_refused: int = 0  # binds the extender answered with an error (a locked node, mostly)


def sample(pods: tuple[TracePod, ...], count: int, seed: int) -> list[TracePod]:
    gpu = [p for p in pods if p.request.num_gpu > 0]
    order = np.random.default_rng(seed).permutation(len(gpu))
    return [gpu[i] for i in order[:count]]


def pod_manifest(pod: TracePod) -> dict[str, Any]:
    r = pod.request
    limits: dict[str, str] = {"gpuslice.io/gpu": str(r.num_gpu)}
    if r.gpu_milli < MILLI_PER_GPU:
        limits["gpuslice.io/gpucores"] = str(r.gpu_milli // 10)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name},
        "spec": {
            "schedulerName": "gpuslice-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/openb:1",
                    "resources": {
                        "requests": {"cpu": f"{r.cpu_milli}m", "memory": f"{r.memory_bytes // MiB}Mi"},
                        "limits": limits,
                    },
                }
            ],
        },
    }


def node_plugin(spec: NodeSpec, kube: NodeKubeClient, state_root: Path) -> DevicePlugin:
    """The device plugin a GPU node of the trace would run (simulated GPUs: its Allocate answers with
    stand-in device nodes under ``state_root``)."""
    machine = Machine(
        spec.name,
        tuple(
            GpuInfo(i, f"{SIMULATED_UUID_PREFIX}{spec.name}-{i}", spec.gpu_model, spec.gpu_memory_bytes)
            for i in range(spec.gpu_count)
        ),
    )
    return DevicePlugin(machine, spec.name, pods=kube, split_count=SPLIT, state_dir=state_root / spec.name)


def register_nodes(core: Any, nodes: tuple[NodeSpec, ...], plugins: dict[str, DevicePlugin]) -> None:
    from kubernetes import client

    for spec in nodes:
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=spec.name)))
        capacity = {"cpu": f"{spec.cpu_milli}m", "memory": f"{spec.memory_bytes // MiB}Mi", "pods": "250"}
        if spec.gpu_count:
            capacity["gpuslice.io/gpu"] = str(spec.gpu_count * SPLIT)
        core.patch_node_status(spec.name, {"status": {"capacity": capacity, "allocatable": capacity}})
        # what the node lifecycle controller does once the kubelet is Ready (no controller-manager here)
        core.patch_node(spec.name, {"spec": {"taints": None}})
        if spec.gpu_count:
            memory_mib = spec.gpu_memory_bytes // MiB
            gpus = plugins[spec.name].machine.gpus
            inventory = NodeInventory(
                gpus=tuple(InventoryGpu(g.index, g.uuid, g.model, memory_mib) for g in gpus),
                split_count=SPLIT,
            )
            core.patch_node(
                spec.name, {"metadata": {"annotations": {ANNOTATION_NODE_INVENTORY: inventory.to_json()}}}
            )


def scheduler_config(port: int, mode: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((REPO / "deploy/kubernetes/20-scheduler.yaml").read_text()) if d]
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.yaml"])
    config["leaderElection"] = {"leaderElect": False}
    (extender,) = config["extenders"]
    extender["urlPrefix"] = f"http://127.0.0.1:{port}"
    if mode == "default":  # kube-scheduler's own scoring picks among the nodes our filter passes
        del extender["prioritizeVerb"]
        extender.pop("weight", None)
    return config


def histogram_quantiles(text: str, name: str, labels: str = "") -> tuple[float, float]:
    """p50 and p99 (ms) of a Prometheus histogram, linear within the bucket, summed over label sets
    that contain ``labels``."""
    buckets: Counter[float] = Counter()
    for line in text.splitlines():
        if not line.startswith(f"{name}_bucket{{") or labels not in line:
            continue
        le = re.search(r'le="([^"]+)"', line)
        if le:
            buckets[float(le.group(1))] += float(line.rsplit(" ", 1)[1])
    if not buckets:
        return (float("nan"), float("nan"))
    edges = sorted(buckets)
    counts = [buckets[e] for e in edges]
    total = counts[-1]
    out = []
    for q in (0.5, 0.99):
        rank = q * total
        prev_edge, prev_count = 0.0, 0.0
        for edge, count in zip(edges, counts, strict=True):
            if count >= rank:
                if edge == float("inf"):
                    out.append(prev_edge * 1000)
                else:
                    share = (rank - prev_count) / (count - prev_count) if count > prev_count else 1.0
                    out.append((prev_edge + (edge - prev_edge) * share) * 1000)
                break
            prev_edge, prev_count = edge, count
    return (out[0], out[1])


def fetch(url: str) -> str:
    context = ssl._create_unverified_context() if url.startswith("https") else None
    with urllib.request.urlopen(url, timeout=10, context=context) as answer:
        return answer.read().decode()


def run_mode(
    bin_dir: Path, mode: str, trace: Any, pods: list[TracePod], target_csv: Path, admission_s: float
) -> Run:
    import os
    import tempfile

    from kubernetes import client, config

    plane = ControlPlane(bin_dir)
    plane.start()
    kubelets: KubeletStandIn | None = None
    try:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 8
        core = client.CoreV1Api(client.ApiClient(cfg))
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="bench")))
        started = time.perf_counter()
        state_root = Path(tempfile.mkdtemp(prefix="gpuslice-k8s-e2e-bench-"))
        kube = NodeKubeClient(api_client=client.ApiClient(cfg))
        plugins = {n.name: node_plugin(n, kube, state_root) for n in trace.nodes if n.gpu_count}
        register_nodes(core, trace.nodes, plugins)
        print(
            f"  {mode}: {len(trace.nodes)} nodes registered in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
        port = free_port()
        policy = {"default": "bestfit"}.get(mode, mode)
        args = ["--policy", policy, "--target-workload", str(target_csv)]
        if mode == "default":
            args.append("--no-decide")
        plane.start_extender(GPUSLICE, port, *args)
        _, scheduler_port = plane.start_scheduler(scheduler_config(port, mode))
        kubelets = KubeletStandIn(core, plugins, admission_delay_s=admission_s).start()
        result = Run(mode, len(pods))
        first = time.perf_counter()
        last_bind = first
        for pod in pods:
            core.create_namespaced_pod("bench", pod_manifest(pod))
        created = time.perf_counter()
        print(f"  {mode}: {len(pods)} pods created in {created - first:.0f} s", flush=True)
        # progress from the stand-in's watch (a bind is heard within milliseconds); listing 6,000 pods
        # through the Python client every half second would cost more CPU than the scheduler
        bound = 0
        while True:
            now_bound = len(kubelets.heard)
            if now_bound > bound:
                bound, last_bind = now_bound, time.perf_counter()
            if bound == len(pods) or time.perf_counter() - last_bind > SETTLE_S:
                break
            time.sleep(0.5)
        deadline = time.perf_counter() + SETTLE_S  # the last Allocate calls
        while len(kubelets.allocated) + len(kubelets.refused) < bound and time.perf_counter() < deadline:
            time.sleep(0.2)
        listed = core.list_namespaced_pod("bench").items
        result.bound = sum(1 for p in listed if p.spec.node_name)
        result.allocated = len(kubelets.allocated)
        result.refused = len(kubelets.refused)
        result.wall_s = last_bind - first
        result.mapping = {p.metadata.name: p.spec.node_name for p in listed if p.spec.node_name}
        allocated = 0
        for p in listed:
            if not p.spec.node_name:
                continue
            decision = Decision.from_annotations(p.metadata.annotations or {})
            assert decision is not None, p.metadata.name
            request = next(q.request for q in pods if q.name == p.metadata.name)
            allocated += request.total_gpu_milli
        total = sum(n.gpu_count for n in trace.nodes) * MILLI_PER_GPU
        result.unallocated_pct = 100.0 * (total - allocated) / total
        metrics = fetch(f"https://127.0.0.1:{scheduler_port}/metrics")
        result.algorithm_ms = histogram_quantiles(metrics, "scheduler_scheduling_algorithm_duration_seconds")
        ours = fetch(f"http://127.0.0.1:{port}/metrics")
        for verb in ("filter", "prioritize", "bind"):
            result.extender_ms[verb] = histogram_quantiles(
                ours, "gpuslice_extender_request_duration_seconds", f'verb="{verb}"'
            )
        refused = re.search(r'gpuslice_extender_decisions_total\{result="refused",verb="bind"\} (\S+)', ours)
        result.binds_refused = int(float(refused.group(1))) if refused else -1
        result.load = os.getloadavg()[0]
        return result
    finally:
        if kubelets is not None:
            kubelets.stop()
        plane.stop()


def sim_mapping(
    trace: Any, pods: list[TracePod], policy: str, target: TargetWorkload
) -> tuple[dict[str, str], float]:
    """The same sequence through the same Placer, deciding as the extender decides on kube-scheduler:
    the policy scores a ledger of GPUs only (nodes in name order, CPU and memory left out, the same
    target workload), over the nodes that also pass a second ledger with the nodes' CPU and memory,
    which stands for kube-scheduler's NodeResourcesFit filter in front of the extender."""
    gpu_nodes = sorted((n for n in trace.nodes if n.gpu_count), key=lambda n: n.name)
    full = Ledger(gpu_nodes)  # CPU, memory and GPUs: what kube-scheduler's own filter checks
    ledger = Ledger([NodeSpec(n.name, 0, 0, n.gpu_count, n.gpu_model, n.gpu_memory_bytes) for n in gpu_nodes])
    context = PolicyContext(rng=np.random.default_rng(0), target=target)
    placer = Placer(ledger, placement_policy(policy)(ledger.view, context))
    mapping = {}
    for pod in pods:
        r = pod.request
        request = Request(0, 0, r.num_gpu, r.gpu_milli, r.gpu_models)
        mask = full.fits(r) & placer.feasible(request)
        if not mask.any():
            continue
        node = placer.choose_node(request, mask)
        placement = placer._reserve_with_advice(request, node)
        assert isinstance(placement, Placement), placement  # the ledger said the node fits
        assert isinstance(full.reserve(node, placement.gpus, r), Placement)
        mapping[pod.name] = gpu_nodes[node].name
    total = ledger.total_gpu_milli
    return mapping, 100.0 * (total - ledger.allocated_gpu_milli) / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=2000, help="GPU pods sampled from the trace")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--modes", default="fgd,bestfit,default", help="comma list of fgd, bestfit, default")
    parser.add_argument(
        "--admission-ms",
        type=float,
        default=300.0,
        help="the kubelet stand-in's delay from hearing of a bind to Allocate (a real kubelet held the "
        "node lock about 0.44 s at p50 in benchmarks/k8s_node.py, Allocate's own API calls included)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out" / "k8s_e2e.json")
    args = parser.parse_args()
    bin_dir = binaries_dir()
    if bin_dir is None:
        sys.exit("error: set GPUSLICE_K8S_BIN to the folder scripts/k8s-e2e built (kube-apiserver, …)")
    trace = load_trace("default")
    pods = sample(trace.pods, args.pods, args.seed)
    target_csv = bundled_dir() / "openb_pod_list_default.csv"
    target = TargetWorkload.gpu_part(p.request for p in trace.pods)
    runs = []
    for mode in args.modes.split(","):
        print(f"{mode}: starting", flush=True)
        run = run_mode(bin_dir, mode, trace, pods, target_csv, args.admission_ms / 1000)
        runs.append(run)
        print(
            f"  {mode}: {run.bound}/{run.pods} bound in {run.wall_s:.1f} s; "
            f"unallocated {run.unallocated_pct:.2f} %; Allocate {run.allocated} answered, "
            f"{run.refused} refused",
            flush=True,
        )
    rows = []
    for run in runs:
        row: dict[str, Any] = {
            "mode": run.mode,
            "pods": run.pods,
            "bound": run.bound,
            "pods_per_s": round(run.bound / run.wall_s, 1) if run.wall_s else None,
            "unallocated_gpu_pct": round(run.unallocated_pct, 2),
            "scheduling_algorithm_ms_p50_p99": [round(x, 2) for x in run.algorithm_ms],
            "extender_ms_p50_p99": {v: [round(x, 2) for x in q] for v, q in run.extender_ms.items()},
            "binds_refused": run.binds_refused,
            "allocated": run.allocated,
            "allocate_refused": run.refused,
            "load_avg_1m": round(run.load, 1),
        }
        if run.mode != "default":
            mapping, sim_unallocated = sim_mapping(trace, pods, run.mode, target)
            same = sum(1 for name, node in run.mapping.items() if mapping.get(name) == node)
            differ = {
                n: (run.mapping.get(n), mapping.get(n))
                for n in set(run.mapping) | set(mapping)
                if run.mapping.get(n) != mapping.get(n)
            }
            order = [p.name for p in pods]
            first = next((i for i, n in enumerate(order) if run.mapping.get(n) != mapping.get(n)), None)
            (args.out.parent / f"k8s_e2e_mapping_{run.mode}.json").write_text(
                json.dumps({"kube-scheduler": run.mapping, "sim": mapping}, indent=0)
            )
            row["sim"] = {
                "unallocated_gpu_pct": round(sim_unallocated, 2),
                "same_node": same,
                "first_difference_at": first,
                "different": len(differ),
                "first_differences": dict(list(sorted(differ.items()))[:10]),
            }
        rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
