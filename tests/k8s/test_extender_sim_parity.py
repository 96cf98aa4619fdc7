"""The extender decides as ``gpuslice sim`` does: the same openb pods, offered to its filter in the same
order with kube-scheduler's CPU/memory filter in front (a second ledger), land on the same nodes as in
a replay through the shared ``Placer`` over the GPU-only ledger the extender keeps."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from test_extender import FakeApi, node_event

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpuslice.k8s.annotations import InventoryGpu, NodeInventory
from gpuslice.k8s.extender import ClusterState
from gpuslice.ledger.ledger import Ledger
from gpuslice.sim.trace import load_trace
from gpuslice.units import MiB
from gpuslice.workload.request import MILLI_PER_GPU, Request
from gpuslice.workload.target import TargetWorkload
from k8s_e2e import sim_mapping

PODS = 300


def manifest(name: str, r: Request) -> dict:
    limits = {"gpuslice.io/gpu": str(r.num_gpu)}
    if r.gpu_milli < MILLI_PER_GPU:
        limits["gpuslice.io/gpucores"] = str(r.gpu_milli // 10)
    return {
        "metadata": {"name": name, "namespace": "b", "uid": f"u-{name}"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


@pytest.mark.parametrize("policy", ["bestfit", "fgd"])
def test_extender_places_an_openb_sequence_exactly_as_the_shared_placer(policy):
    trace = load_trace("default")
    gpu_pods = [p for p in trace.pods if p.request.num_gpu]
    pods = [gpu_pods[i] for i in np.random.default_rng(42).permutation(len(gpu_pods))[:PODS]]
    target = TargetWorkload.gpu_part(p.request for p in trace.pods)
    nodes = sorted((n for n in trace.nodes if n.gpu_count), key=lambda n: n.name)

    api = FakeApi()
    state = ClusterState(api, default_policy=policy, narrow=True, target=target)
    for n in nodes:
        gpus = tuple(
            InventoryGpu(i, f"GPU-{n.name}-{i}", n.gpu_model, n.gpu_memory_bytes // MiB)
            for i in range(n.gpu_count)
        )
        state.apply(node_event(n.name, NodeInventory(gpus=gpus, split_count=20)))
    in_tree = Ledger(nodes)  # CPU and memory: kube-scheduler's NodeResourcesFit in front of the extender
    extender = {}
    for pod in pods:
        offered = [nodes[i].name for i in np.flatnonzero(in_tree.fits(pod.request))]
        chosen = state.filter(manifest(pod.name, pod.request), offered).passed
        if not chosen:
            continue
        api.pods[("b", pod.name)] = manifest(pod.name, pod.request)
        assert state.bind("b", pod.name, f"u-{pod.name}", chosen[0]) == ""
        gpus = state.cache.pods[f"u-{pod.name}"].decision.gpu_indices
        in_tree.reserve(next(i for i, n in enumerate(nodes) if n.name == chosen[0]), gpus, pod.request)
        extender[pod.name] = chosen[0]

    sim, _ = sim_mapping(trace, pods, policy, target)

    assert len(extender) == PODS
    assert extender == sim
    state.check_invariants()
