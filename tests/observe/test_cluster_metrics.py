"""Cluster metrics from the ledgers (observe/cluster_metrics.py): the extender's /metrics over a small
cluster with known slices gives exact values per node, pods pending by reason code and preemptions; a
node removed leaves no series behind; the DRA allocator exports the same families for its pools on its
own --metrics-port; a scrape costs a fixed number of series per node."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import warnings
from collections.abc import Mapping
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

with warnings.catch_warnings():
    # starlette asks for its httpx2 fork at import; the httpx we have serves these tests the same.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from gpuslice.errors import UserError
from gpuslice.k8s.annotations import ANNOTATION_NODE_INVENTORY, InventoryGpu, NodeInventory
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.extender import ClusterState, WatchEvent, create_app
from gpuslice.observe.cluster_metrics import (
    PENDING_REASONS,
    ClusterCollector,
    ClusterFigures,
    pending_by_reason,
    tally_gpus,
)
from gpuslice.observe.k8s_metrics import ExtenderMetrics

GIB = 1 << 30
MIB = 1 << 20
NODE_FAMILIES = (
    "gpuslice_cluster_node_gpus",
    "gpuslice_cluster_node_gpus_allocated",
    "gpuslice_cluster_node_gpu_memory_bytes",
    "gpuslice_cluster_node_gpu_memory_allocated_bytes",
    "gpuslice_cluster_node_gpu_unallocated_ratio",
    "gpuslice_cluster_node_gpu_fragmentation_ratio",
)


class Api:
    """The extender's API calls, recorded and always answered."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.deleted: list[str] = []

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.pods[(namespace, name)]

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        return None

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        return None

    def create_event(self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str) -> None:
        return None

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append(name)

    def pod_gone(self, namespace: str, name: str, uid: str) -> bool:
        return False


def node(name: str, model: str, memory_mib: int, gpus: int) -> WatchEvent:
    inventory = NodeInventory(
        tuple(InventoryGpu(i, f"GPU-{name}-{i}", model, memory_mib) for i in range(gpus))
    )
    meta = {"name": name, "annotations": {ANNOTATION_NODE_INVENTORY: inventory.to_json()}}
    return WatchEvent("Node", "ADDED", {"metadata": meta})


def pod(name: str, resources: Mapping[str, str], on: str = "", gpus: tuple[int, ...] = (), priority: int = 0):
    annotations = Decision(on, "main", gpus, (), 0, 100).to_annotations() if on else {}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "resources": {"limits": dict(resources), "requests": dict(resources)}}
        ],
        "priority": priority,
    }
    if on:
        spec["nodeName"] = on
    meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": annotations}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


WHOLE = {"gpuslice.io/gpu": "1"}
SHARE = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "10240", "gpuslice.io/gpucores": "25"}
TWO = {"gpuslice.io/gpu": "2"}


def cluster(api: Api | None = None) -> ClusterState:
    """a: 2 A100-80GB, a whole GPU on GPU 0 and a 25 % / 10 GiB share on GPU 1; b: 1 H100 (81,559 MiB),
    free."""
    state = ClusterState(api or Api())
    state.apply(node("a", "A100-80GB", 81920, 2))
    state.apply(node("b", "H100", 81559, 1))
    state.apply(WatchEvent("Pod", "ADDED", pod("whole", WHOLE, on="a", gpus=(0,))))
    state.apply(WatchEvent("Pod", "ADDED", pod("share", SHARE, on="a", gpus=(1,))))
    return state


def scrape(client: TestClient) -> dict[tuple[str, frozenset], float]:
    text = client.get("/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("gpuslice_cluster_")
    }


def at(samples: Mapping[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_the_extenders_metrics_give_each_nodes_gpus_allocation_and_fragmentation_exactly():
    with TestClient(create_app(cluster())) as client:
        s = scrape(client)
    assert at(s, "gpuslice_cluster_node_gpus", node="a", model="A100-80GB") == 2
    assert at(s, "gpuslice_cluster_node_gpus", node="b", model="H100") == 1
    assert at(s, "gpuslice_cluster_node_gpus_allocated", node="a") == 1.25  # a whole GPU and a quarter
    assert at(s, "gpuslice_cluster_node_gpus_allocated", node="b") == 0
    assert at(s, "gpuslice_cluster_node_gpu_memory_bytes", node="a") == 2 * 80 * GIB
    assert at(s, "gpuslice_cluster_node_gpu_memory_bytes", node="b") == 81559 * MIB
    # the whole GPU holds all 80 GiB of GPU 0; the share its 10 GiB limit of GPU 1
    assert at(s, "gpuslice_cluster_node_gpu_memory_allocated_bytes", node="a") == 90 * GIB
    assert at(s, "gpuslice_cluster_node_gpu_memory_allocated_bytes", node="b") == 0
    assert at(s, "gpuslice_cluster_node_gpu_unallocated_ratio", node="a") == 0.375  # 750 of 2,000
    assert at(s, "gpuslice_cluster_node_gpu_unallocated_ratio", node="b") == 1.0
    # the target is the bound pods' shapes, 1/2 whole and 1/2 a 250 share: GPU 1's 750 fits the share
    # only, so half of it is fragmented: 375 of 2,000
    assert at(s, "gpuslice_cluster_node_gpu_fragmentation_ratio", node="a") == 0.1875
    assert at(s, "gpuslice_cluster_node_gpu_fragmentation_ratio", node="b") == 0
    for reason in PENDING_REASONS:
        assert at(s, "gpuslice_cluster_pending_pods", reason=reason) == 0
    assert not [k for k in s if k[0] == "gpuslice_cluster_pending_longest_wait_seconds"]
    assert at(s, "gpuslice_cluster_preemptions_total") == 0
    assert len(s) == 6 * 2 + len(PENDING_REASONS) + 1  # nothing per pod


def test_a_refused_pod_is_counted_pending_by_its_code_until_it_binds():
    api = Api()
    state = cluster(api)
    with TestClient(create_app(state)) as client:
        waiting = pod("two", TWO)
        assert state.filter(waiting, ["a", "b"]).passed == []
        s = scrape(client)
        assert at(s, "gpuslice_cluster_pending_pods", reason="insufficient_gpu") == 1
        assert sum(v for k, v in s.items() if k[0] == "gpuslice_cluster_pending_pods") == 1
        assert 0 <= at(s, "gpuslice_cluster_pending_longest_wait_seconds", reason="insufficient_gpu") < 60
        # the whole GPU's pod ends: the pod fits on a, binds, and waits no more
        state.apply(WatchEvent("Pod", "DELETED", pod("whole", WHOLE, on="a", gpus=(0,))))
        state.apply(WatchEvent("Pod", "DELETED", pod("share", SHARE, on="a", gpus=(1,))))
        assert state.filter(waiting, ["a", "b"]).passed == ["a"]
        api.pods[("ml", "two")] = waiting
        assert state.bind("ml", "two", "uid-two", "a") == ""
        s = scrape(client)
        assert at(s, "gpuslice_cluster_pending_pods", reason="insufficient_gpu") == 0
        assert not [k for k in s if k[0] == "gpuslice_cluster_pending_longest_wait_seconds"]
        assert at(s, "gpuslice_cluster_node_gpus_allocated", node="a") == 2


def test_a_removed_node_leaves_no_series_behind():
    state = cluster()
    with TestClient(create_app(state)) as client:
        assert {dict(k[1]).get("node") for k in scrape(client)} == {"a", "b", None}
        state.apply(WatchEvent("Node", "DELETED", {"metadata": {"name": "a"}}))
        s = scrape(client)
    assert {dict(k[1]).get("node") for k in s} == {"b", None}
    assert len([k for k in s if dict(k[1]).get("node") == "b"]) == 6


def test_preemptions_are_the_extenders_count():
    api = Api()
    state = ClusterState(api)
    state.apply(node("n", "A100-80GB", 81920, 1))
    state.apply(WatchEvent("Pod", "ADDED", pod("low", WHOLE, on="n", gpus=(0,), priority=1)))
    with TestClient(create_app(state)) as client:
        state.filter(pod("urgent", WHOLE, priority=100), ["n"])
        s = scrape(client)
    assert api.deleted == ["low"] and state.preemptions == 1
    assert at(s, "gpuslice_cluster_preemptions_total") == 1
    assert at(s, "gpuslice_cluster_pending_pods", reason="preempting") == 1


def test_series_grow_by_six_per_node_and_never_per_pod():
    state = ClusterState(Api())
    for i in range(50):
        state.apply(node(f"n{i:02d}", "L4", 23034, 8))
    for i in range(50):
        for g in range(8):
            for k in range(3):  # 1,200 pods
                state.apply(
                    WatchEvent("Pod", "ADDED", pod(f"p{i}-{g}-{k}", SHARE, on=f"n{i:02d}", gpus=(g,)))
                )
    for k in range(30):
        state.filter(pod(f"wait{k}", {"gpuslice.io/gpu": "8"}), [f"n{i:02d}" for i in range(50)])
    with TestClient(create_app(state)) as client:
        s = scrape(client)
    assert len(s) == 6 * 50 + len(PENDING_REASONS) + 1 + 1  # one reason has pods waiting: its wait
    assert at(s, "gpuslice_cluster_pending_pods", reason="insufficient_gpu") == 30


def test_the_exposition_is_built_off_the_event_loop(monkeypatch):
    """1,000 nodes' series take tens of milliseconds to write out: on the event loop that would hold up
    kube-scheduler's /filter calls (benchmarks/cluster_metrics.py)."""
    on_loop: list[bool] = []
    real = ExtenderMetrics.exposition

    def exposition(self: ExtenderMetrics) -> bytes:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return real(self)

    monkeypatch.setattr(ExtenderMetrics, "exposition", exposition)
    with TestClient(create_app(cluster())) as client:
        assert b"gpuslice_cluster_node_gpus" in client.get("/metrics").content
    assert on_loop == [False]


def test_a_home_that_cannot_read_its_ledger_shows_none_of_the_families():
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: None))
    assert b"gpuslice_cluster" not in generate_latest(registry)


def test_the_tally_counts_a_gpus_memory_once_however_many_unfenced_shares_it_holds():
    from gpuslice.ledger.placement import Placement
    from gpuslice.workload.request import Request

    capacity = np.full((1, 2), 80 * GIB)
    unfenced = Request(0, num_gpu=1, gpu_milli=300)
    fenced = Request(0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=10 * GIB)
    placements = [
        Placement(0, (0,), unfenced, 1),
        Placement(0, (0,), unfenced, 2),
        Placement(0, (1,), fenced, 3),
    ]
    tally = tally_gpus(placements, capacity, np.ones((1, 2), dtype=bool))
    assert tally.allocated_milli.tolist() == [[600, 100]]
    assert tally.allocated_memory_bytes.tolist() == [[80 * GIB, 10 * GIB]]
    assert tally.unallocated_milli.tolist() == [[400, 900]]
    assert tally.slices.tolist() == [[2, 1]]
    assert tally.slice_of.tolist() == [0, 1, 2] and tally.slice_memory_bytes.tolist() == [80 * GIB] * 2 + [
        10 * GIB
    ]


def test_pending_pods_count_by_reason_with_the_longest_wait_of_each():
    waiting = [("quota", 50.0), ("quota", 100.0), ("no_mig_slot", 90.0)]
    assert pending_by_reason(waiting, now=200.0) == {"quota": (2, 150.0), "no_mig_slot": (1, 110.0)}


def test_figures_of_a_node_without_gpus_give_zero_ratios_not_nan():
    zero = np.array([0])
    f = ClusterFigures(["cpu"], [""], zero, zero, zero, zero, zero, np.array([0.0]))
    assert f.ratio(f.unallocated_milli).tolist() == [0.0] and f.cluster_ratio(f.fragmented_milli) == 0.0


# ---- the DRA allocator's pools ---------------------------------------------------------------------------

dra = pytest.importorskip("gpuslice.k8s.dra.allocator")


class DraApi:
    """ResourceSlices of one 4-GPU L4 pool and claims as the allocator reads them; ``fail`` breaks lists."""

    def __init__(self) -> None:
        from gpuslice.k8s.dra.identity import gpu_identities
        from gpuslice.k8s.dra.slices import node_slices
        from gpuslice.node.discovery import discover

        machine = discover("pcie-4x-l4")
        self.slices = node_slices(machine, "gpu-1", generation=1, identities=gpu_identities(machine))
        self.claims: list[dict[str, Any]] = []
        self.pods: list[dict[str, Any]] = []
        self.fail = False

    def add(self, name: str, device_class: str, capacity: Mapping[str, str] | None = None) -> None:
        exactly: dict[str, Any] = {"deviceClassName": device_class, "count": 1}
        if capacity:
            exactly["capacity"] = {"requests": dict(capacity)}
        self.claims.append(
            {
                "metadata": {"namespace": "ml", "name": name, "uid": f"c-{name}"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
            }
        )
        spec = {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "schedulingGates": [{"name": dra.GATE}],
        }
        self.pods.append({"metadata": {"namespace": "ml", "name": name, "uid": f"p-{name}"}, "spec": spec})

    def list_slices(self) -> list[dict[str, Any]]:
        if self.fail:
            raise ConnectionError("connection refused")
        return self.slices

    def list_claims(self) -> list[dict[str, Any]]:
        if self.fail:
            raise ConnectionError("connection refused")
        return self.claims

    def list_pods(self) -> list[dict[str, Any]]:
        return self.pods

    def write_allocation(self, claim: Mapping[str, Any], allocation: Mapping[str, Any]) -> None:
        stored = next(c for c in self.claims if c["metadata"]["name"] == claim["metadata"]["name"])
        stored["status"] = {"allocation": allocation}

    def ungate(self, pod: Mapping[str, Any], gate: str) -> None:
        for p in self.pods:
            if p["metadata"]["uid"] == pod["metadata"]["uid"]:
                p["spec"]["schedulingGates"] = []

    def pod_event(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        return None

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        return None


def dra_samples(text: bytes) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def _allocated_pools() -> tuple[DraApi, Any]:
    from gpuslice.k8s.dra.classes import CLASS_SHARED, CLASS_WHOLE

    api = DraApi()
    api.add("whole", CLASS_WHOLE)
    api.add("share", CLASS_SHARED, {"memory": "4Gi", "cores": "30"})
    api.add("huge", CLASS_SHARED, {"memory": "4Ti", "cores": "10"})
    allocator = dra.DraAllocator(api)
    allocator.run_once()
    return api, allocator


def test_the_dra_allocator_exports_its_pools_pending_pods_and_preemptions():
    from gpuslice.k8s.dra.pool_metrics import DraMetrics
    from gpuslice.k8s.dra.slices import memory_default_mib

    api, allocator = _allocated_pools()
    s = dra_samples(DraMetrics(api, allocator).exposition())
    l4 = 23034 * MIB  # the simulated L4's memory
    assert at(s, "gpuslice_cluster_node_gpus", node="gpu-1", model="L4") == 4
    assert at(s, "gpuslice_cluster_node_gpus_allocated", node="gpu-1") == 1.3  # a whole GPU and 30 %
    assert at(s, "gpuslice_cluster_node_gpu_memory_bytes", node="gpu-1") == 4 * l4
    # a whole GPU's claim consumes the most a claim can take there: its memory on a 256 MiB step
    whole = memory_default_mib(l4) * MIB
    assert at(s, "gpuslice_cluster_node_gpu_memory_allocated_bytes", node="gpu-1") == whole + 4 * GIB
    assert at(s, "gpuslice_cluster_node_gpu_unallocated_ratio", node="gpu-1") == 0.675  # 2,700 of 4,000
    # target: the allocated claims' shapes, 1/2 whole and 1/2 a 300 share: the 700 beside the share fits
    # the share only, so half of it is fragmented: 350 of 4,000
    assert at(s, "gpuslice_cluster_node_gpu_fragmentation_ratio", node="gpu-1") == 0.0875
    assert at(s, "gpuslice_cluster_pending_pods", reason="insufficient_gpu_memory") == 1
    assert at(s, "gpuslice_cluster_pending_longest_wait_seconds", reason="insufficient_gpu_memory") >= 0
    assert at(s, "gpuslice_cluster_preemptions_total") == 0


def test_a_dra_pod_that_is_placed_later_or_loses_its_gate_is_pending_no_more():
    from gpuslice.k8s.dra.classes import CLASS_SHARED

    api, allocator = _allocated_pools()
    api.add("also-huge", CLASS_SHARED, {"memory": "4Ti", "cores": "10"})
    allocator.run_once()
    assert set(allocator.pending) == {"p-huge", "p-also-huge"}
    since = allocator.pending["p-also-huge"][1]
    # its claim asks for less now: placed and ungated in this pass
    huge = next(c for c in api.claims if c["metadata"]["name"] == "huge")
    huge["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "1Gi"
    allocator.run_once()
    assert set(allocator.pending) == {"p-also-huge"} and api.claims[2].get("status")
    time.sleep(0.01)
    allocator.run_once()
    assert allocator.pending["p-also-huge"][1] == since  # refused again: its first refusal's time kept
    api.pods = [p for p in api.pods if p["metadata"]["name"] != "also-huge"]  # deleted
    allocator.run_once()
    assert allocator.pending == {}


def test_a_dra_scrape_without_the_api_has_no_pool_series_but_still_its_pending_pods(caplog):
    from gpuslice.k8s.dra.pool_metrics import DraMetrics

    api, allocator = _allocated_pools()
    api.fail = True
    with caplog.at_level(logging.WARNING):
        s = dra_samples(DraMetrics(api, allocator).exposition())
    assert not [k for k in s if k[0] in NODE_FAMILIES]
    assert at(s, "gpuslice_cluster_pending_pods", reason="insufficient_gpu_memory") == 1
    assert "cannot read the DRA pools: connection refused" in caplog.text


def test_the_dra_allocators_metrics_port_serves_and_a_taken_port_is_one_clear_error():
    from gpuslice.k8s.dra.pool_metrics import DraMetrics
    from gpuslice.observe.metrics_server import serve_metrics

    api, allocator = _allocated_pools()
    with socket.socket() as probe:  # a port free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stop = serve_metrics(DraMetrics(api, allocator).registry, port)
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert 'gpuslice_cluster_node_gpus{model="L4",node="gpu-1"} 4.0' in text
        with pytest.raises(
            UserError, match=rf"--metrics-port {port}: cannot listen there .*; give a free port"
        ):
            serve_metrics(DraMetrics(api, allocator).registry, port)
    finally:
        stop()
    with pytest.raises(httpx.TransportError):  # stopped: the port answers no more
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_the_dra_allocators_metrics_port_is_checked_before_anything_starts(run_cli):
    code, out, err = run_cli(["k8s", "dra-allocator", "--metrics-port", "70000"])
    assert code == 2
    assert "--metrics-port" in out + err and "from 1 to 65,535" in out + err
