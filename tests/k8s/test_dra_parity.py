"""The DRA allocator decides as its offline replay does: a live allocator rebuilds its ledger from the
API every pass (each pod may arrive in a pass of its own), the replay places the same claims in order in
one ledger; for FGD and best fit they must agree device for device on openb's nodes and pods.

They parted before (799 of 1,000 with FGD): FGD floors its score, and a node's fragmentation moved in
its last bits with the number of nodes measured in the same call, so a zero gain scored 49 or 50.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from test_dra_allocator import FakeApi

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.k8s.dra.allocator import DraAllocator, Inventory
from gpuslice.k8s.dra.claim_ask import claim_ask
from gpuslice.k8s.dra.classes import CLASS_SHARED, CLASS_WHOLE
from gpuslice.k8s.dra.slices import node_slices
from gpuslice.scheduler.placer import Unplaced
from gpuslice.sim.trace import bundled_dir, load_target_workload, load_trace
from gpuslice.units import MiB
from gpuslice.workload.request import MILLI_PER_GPU, Request

NODES, PODS = 60, 200


def _claim_spec(req: Request, smallest_mib: int) -> dict[str, Any]:
    """A share as ``gpu.gpuslice.io`` with cores and the same fraction of the smallest GPU's memory;
    several or whole GPUs as ``whole-gpu.gpuslice.io`` (as benchmarks/dra_openb.py writes them)."""
    if req.num_gpu == 1 and req.gpu_milli < MILLI_PER_GPU:
        mib = max(256, math.ceil(smallest_mib * req.gpu_milli / MILLI_PER_GPU / 256) * 256)
        capacity = {"memory": f"{mib}Mi", "cores": str(max(1, math.ceil(req.gpu_milli / 10)))}
        exactly: dict[str, Any] = {
            "deviceClassName": CLASS_SHARED,
            "count": 1,
            "capacity": {"requests": capacity},
        }
    else:
        exactly = {"deviceClassName": CLASS_WHOLE, "count": req.num_gpu}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


@pytest.fixture(scope="module")
def openb() -> tuple[list[Machine], list[Request]]:
    trace = load_trace()
    nodes = [n for n in trace.nodes if 0 < n.gpu_count <= 8][:NODES]
    machines = [
        Machine(
            name=f"n{i:03d}",
            gpus=tuple(
                GpuInfo(g, f"GPU-{i:03d}-{g}", n.gpu_model, n.gpu_memory_bytes or 16 * 1024 * MiB)
                for g in range(n.gpu_count)
            ),
        )
        for i, n in enumerate(nodes)
    ]
    gpu_pods = [p.request for p in trace.pods if p.request.num_gpu]
    order = np.random.default_rng(7).permutation(len(gpu_pods))[:PODS]
    return machines, [gpu_pods[i] for i in order]


@pytest.mark.parametrize("policy", ["fgd", "bestfit"])
def test_the_live_allocator_pass_by_pass_decides_as_one_offline_ledger(openb, policy: str) -> None:
    machines, requests = openb
    target = load_target_workload(bundled_dir() / "openb_pod_list_default.csv")
    smallest = min(g.memory_bytes for m in machines for g in m.gpus) // MiB
    api = FakeApi()
    for m in machines:
        api.slices += node_slices(m, m.name, generation=1)
    allocator = DraAllocator(api, policy, target)
    offline = Inventory(api.list_slices(), [], policy, target=target)
    agree, placed = 0, 0
    for k, req in enumerate(requests):
        name = f"p{k:04d}"
        api.add(name, _claim_spec(req, smallest))
        allocator.run_once()  # a pass of its own: the ledger is rebuilt from the claims
        live = sorted((r["pool"], r["device"]) for r in api.results(name))
        ask = claim_ask(api.claims[("t", name)])
        assert ask is not None
        decision = offline.place(ask, None)
        replay = (
            [] if isinstance(decision, Unplaced) else sorted((decision.node, g.device) for g in decision.gpus)
        )
        agree += live == replay
        placed += bool(live)
    assert placed > PODS // 2  # the cluster really fills: most pods land
    assert agree == PODS
