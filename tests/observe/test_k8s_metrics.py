"""Metrics of the Kubernetes components: the extender's latency and decisions, the device plugin's
device and GPU health (read from a real DevicePlugin object after health changes)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.node.gpu_faults import HealthChange
from gpuslice.observe.k8s_metrics import DevicePluginMetrics, ExtenderMetrics
from gpuslice.units import GiB

device_plugin = pytest.importorskip("gpuslice.k8s.device_plugin")  # needs grpc (the k8s extra)


def samples(text: bytes) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_extender_times_each_verb_and_counts_its_results():
    m = ExtenderMetrics()
    with m.timed("filter"):
        m.decided("filter", "fits")
    with m.timed("bind"):
        m.decided("bind", "refused")
    s = samples(m.exposition())
    assert s[("gpuslice_extender_request_duration_seconds_count", frozenset({("verb", "filter")}))] == 1
    assert s[("gpuslice_extender_request_duration_seconds_count", frozenset({("verb", "prioritize")}))] == 0
    assert s[("gpuslice_extender_decisions_total", frozenset({("verb", "bind"), ("result", "refused")}))] == 1
    assert s[("gpuslice_extender_decisions_total", frozenset({("verb", "filter"), ("result", "error")}))] == 0


def test_a_failed_call_is_still_timed():
    m = ExtenderMetrics()
    with pytest.raises(RuntimeError), m.timed("preempt"):
        raise RuntimeError("boom")
    s = samples(m.exposition())
    assert s[("gpuslice_extender_request_duration_seconds_count", frozenset({("verb", "preempt")}))] == 1


class NoPods:
    def allocating_pods(self, node_name):
        return []

    def annotate_pod(self, namespace, name, annotations):
        return None


def test_device_plugin_health_per_device_and_gpu_follows_health_changes(tmp_path):
    machine = Machine("n", tuple(GpuInfo(i, f"GPU-sim-x-{i}", "H100", 80 * GiB) for i in range(2)))
    plugin = device_plugin.DevicePlugin(
        machine, "node-a", pods=NoPods(), split_count=2, socket_dir=tmp_path, state_dir=tmp_path / "s",
        sharing="soft",
    )  # fmt: skip
    metrics = DevicePluginMetrics(plugin.device_health, plugin.gpu_health)
    before = samples(metrics.exposition())
    healthy = {k: v for k, v in before.items() if k[0] == "gpuslice_device_plugin_device_healthy"}
    assert len(healthy) == 4 and set(healthy.values()) == {1.0}  # 2 GPUs x 2 shares
    plugin.apply_health([HealthChange("GPU-sim-x-1", False, "XID 79")])
    after = samples(metrics.exposition())
    down = {dict(k[1])["device"] for k, v in after.items() if k[0].endswith("device_healthy") and v == 0}
    assert down == {"GPU-sim-x-1::0", "GPU-sim-x-1::1"}

    def gpu(i: int) -> frozenset:
        return frozenset({("gpu", str(i)), ("uuid", f"GPU-sim-x-{i}"), ("model", "H100")})

    assert after[("gpuslice_gpu_healthy", gpu(1))] == 0
    assert after[("gpuslice_gpu_healthy", gpu(0))] == 1


# ---- the extender app, instrumented ---------------------------------------------------------------------


class FakeKube:
    """The calls the extender makes of the API server, recorded."""

    def __init__(self) -> None:
        self.pods: dict = {}
        self.bindings: list = []

    def get_pod(self, namespace, name):
        return self.pods[(namespace, name)]

    def patch_pod_annotations(self, namespace, name, annotations):
        return None

    def create_binding(self, namespace, name, uid, node):
        self.bindings.append((namespace, name, node))

    def create_event(self, namespace, pod_name, pod_uid, reason, message):
        return None


def pod(name: str, memory_mib: int) -> dict:
    limits = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": str(memory_mib)}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": {}},
        "spec": {"schedulerName": "gpuslice-scheduler",
                 "containers": [{"name": "c", "resources": {"limits": limits, "requests": limits}}]},
        "status": {"phase": "Pending"},
    }  # fmt: skip


def test_the_extender_app_times_every_verb_and_counts_results_and_serves_metrics():
    import warnings

    from gpuslice.k8s.annotations import ANNOTATION_NODE_INVENTORY, InventoryGpu, NodeInventory
    from gpuslice.k8s.extender import ClusterState, WatchEvent, create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        from fastapi.testclient import TestClient

    gpu = InventoryGpu(0, "GPU-0", "A100-80GB", 81920, mig=())
    inv = NodeInventory(gpus=(gpu,), topology=(), split_count=4)
    state = ClusterState(FakeKube())
    node = {"name": "n0", "annotations": {ANNOTATION_NODE_INVENTORY: inv.to_json()}}
    state.apply(WatchEvent("Node", "ADDED", {"metadata": node}))
    small, huge = pod("small", 8000), pod("huge", 500_000)
    with TestClient(create_app(state)) as client:
        assert client.post("/filter", json={"Pod": small, "NodeNames": ["n0"]}).json()["NodeNames"] == ["n0"]
        assert client.post("/filter", json={"Pod": huge, "NodeNames": ["n0"]}).json()["NodeNames"] == []
        assert client.post("/filter", content=b"not json").json()["Error"]
        assert client.post("/prioritize", json={"Pod": small, "NodeNames": ["n0"]}).json()[0]["Host"] == "n0"
        bind = {"PodName": "small", "PodNamespace": "ns", "PodUID": "uid-small", "Node": "n0"}
        state.api.pods[("ns", "small")] = small
        assert client.post("/bind", json=bind).json() == {"Error": ""}
        state.api.pods[("ns", "huge")] = huge
        refused = client.post("/bind", json={**bind, "PodName": "huge", "PodUID": "uid-huge"}).json()
        assert refused["Error"]
        r = client.get("/metrics")
    assert r.status_code == 200
    s = samples(r.content)

    def decided(verb: str, result: str) -> float:
        return s[("gpuslice_extender_decisions_total", frozenset({("verb", verb), ("result", result)}))]

    for verb, result in [("filter", "fits"), ("filter", "unschedulable"), ("filter", "error"),
                         ("prioritize", "scored"), ("bind", "bound"), ("bind", "refused")]:  # fmt: skip
        assert decided(verb, result) == 1, (verb, result)
    assert s[("gpuslice_extender_request_duration_seconds_count", frozenset({("verb", "filter")}))] == 3
    assert s[("gpuslice_extender_request_duration_seconds_count", frozenset({("verb", "preempt")}))] == 0


@pytest.mark.parametrize(
    ("verb", "status", "head", "result"),
    [
        ("filter", 200, b'{"NodeNames":["a","b"],"Failed', "fits"),
        ("filter", 200, b'{"NodeNames":[],"FailedNodes"', "unschedulable"),
        ("filter", 200, b'{"NodeNames":null,"FailedNode', "error"),
        ("prioritize", 200, b"[]", "error"),
        ("prioritize", 200, b'[{"Host":"a","Score":3}]', "scored"),
        ("preempt", 200, b'{"NodeNameToMetaVictims":{}}', "none"),
        ("preempt", 200, b'{"NodeNameToMetaVictims":{"a":', "candidates"),
        ("bind", 200, b'{"Error":""}', "bound"),
        ("bind", 200, b'{"Error":"node n0 is full"}', "refused"),
        ("bind", 500, b'{"detail":"boom"}', "error"),
    ],
)
def test_reply_results(verb, status, head, result):
    from gpuslice.observe.k8s_metrics import reply_result

    assert reply_result(verb, status, head) == result
