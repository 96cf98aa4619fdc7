"""The Kubernetes extender takes a policy file as the operator's default placement policy; a pod's
annotation still names built-in policies only (a pod must not make the extender read a file)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette asks for its httpx2 fork at import; httpx serves the same
    from fastapi.testclient import TestClient

from gpuslice.k8s.annotations import (
    ANNOTATION_NODE_INVENTORY,
    ANNOTATION_PLACEMENT_POLICY,
    InventoryGpu,
    NodeInventory,
)
from gpuslice.k8s.extender import ClusterState, WatchEvent, create_app
from gpuslice.programs.loader import PolicyRejected
from gpuslice.sim.tune import DEFAULTS, write_policy

NODES = {"a-0": 8, "a-1": 8, "b-0": 4, "c-0": 2}


class NoApi:
    """The extender's Kubernetes API, for scoring only: events are recorded, nothing else is called."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    def create_event(self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str) -> None:
        self.events.append((namespace, pod_name, reason, message))


def state(policy: str) -> ClusterState:
    cluster = ClusterState(NoApi(), default_policy=policy)  # type: ignore[arg-type]
    for name, gpus in NODES.items():
        inv = NodeInventory(
            gpus=tuple(InventoryGpu(i, f"GPU-{name}-{i}", "A100-80GB", 81920) for i in range(gpus)),
            split_count=10,
        )
        meta = {"name": name, "annotations": {ANNOTATION_NODE_INVENTORY: inv.to_json()}}
        cluster.apply(WatchEvent("Node", "ADDED", {"metadata": meta}))
    return cluster


def pod(name: str, resources: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"limits": resources, "requests": resources}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": {"containers": [{"name": "main", "image": "x", "resources": limits}]},
        "status": {"phase": "Pending"},
    }


@pytest.mark.parametrize(
    "resources",
    [
        {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "8000", "gpuslice.io/gpucores": "30"},
        {"gpuslice.io/gpu": "2"},
        {"gpuslice.io/gpu": "4"},
    ],
    ids=["share", "two whole GPUs", "four whole GPUs"],
)
def test_a_policy_file_scores_nodes_as_the_builtin_it_rewrites(
    resources: dict[str, str], builtin_files: Path
) -> None:
    names, bestfit_file = list(NODES), str(builtin_files / "bestfit.py")
    assert state(bestfit_file).prioritize(pod("p", resources), names) == state("bestfit").prioritize(
        pod("p", resources), names
    )


def test_a_pod_annotation_cannot_name_a_policy_file(builtin_files: Path) -> None:
    bestfit_file = str(builtin_files / "bestfit.py")
    cluster = state(bestfit_file)
    asking = pod("p", {"gpuslice.io/gpu": "1"}, {ANNOTATION_PLACEMENT_POLICY: bestfit_file})
    result = cluster.filter(asking, list(NODES))
    assert result.passed == [] and len(result.unresolvable) == len(NODES)
    assert all("is not a placement policy" in reason for reason in result.unresolvable.values())


def test_a_rejected_policy_file_stops_the_extender_before_it_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from gpuslice.programs.api import PlacementOps\n\n\nclass P(PlacementOps):\n    seen = []\n"
    )
    with pytest.raises(PolicyRejected, match=r"bad.py:5: class P-level seen is not a constant"):
        ClusterState(NoApi(), default_policy=str(bad))  # type: ignore[arg-type]


def test_the_file_gpuslice_tune_writes_ranks_nodes_by_its_weights(tmp_path: Path) -> None:
    # through the extender's HTTP app: a negative GPU weight spreads (the emptiest 8-GPU nodes first), the
    # defaults pack like best fit (the 2-GPU node first)
    spread = write_policy({**DEFAULTS, "CPU_WEIGHT": 0.0, "GPU_WEIGHT": -1.0}, tmp_path / "spread.py")
    packing = write_policy(DEFAULTS, tmp_path / "defaults.py")
    body = {"Pod": pod("p", {"gpuslice.io/gpu": "1"}), "Nodes": None, "NodeNames": list(NODES)}
    scores = {}
    for policy in (spread, packing):
        with TestClient(create_app(state(str(policy)))) as http:
            scores[policy.name] = {s["Host"]: s["Score"] for s in http.post("/prioritize", json=body).json()}
    assert scores["spread.py"] == {"a-0": 10, "a-1": 10, "b-0": 3, "c-0": 0}  # GPUs left 7, 7, 3, 1
    assert scores["defaults.py"] == {"a-0": 0, "a-1": 0, "b-0": 7, "c-0": 10}
