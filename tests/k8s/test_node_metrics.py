"""The node's slice metrics wired to the device plugin (its allocation record, the live pods, its
registration, its metrics port) and to the DRA driver (its prepared claims)."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_device_plugin import (
    NODE,
    TIMEOUT_S,
    FakeApi,
    FakeKubelet,
    allocate,
    dgx1_machine,
    share,
    wait_until,
)
from test_dra_plugin import Claims, result, start

import gpuslice.k8s.device_plugin.record as record_module
import gpuslice.k8s.node_metrics as node_metrics
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.device_plugin import DevicePlugin, serve
from gpuslice.k8s.device_plugin.record import ALLOCATION_RECORD
from gpuslice.k8s.node_metrics import device_plugin_collector, dra_collector
from gpuslice.observe.node_slices import NodeSliceCollector
from gpuslice.shim.region import DeviceUsage, pack_region
from gpuslice.units import GiB, MiB

Samples = dict[tuple[str, frozenset], float]


class LiveApi(FakeApi):
    """The fake API server, which also lists the node's pods that have not ended (by UID)."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: set[str] = set()
        self.lists = 0

    def live_pod_uids(self, node_name: str) -> set[str]:
        self.lists += 1
        return {f"uid-{name}" for (_ns, name) in self.pod_annotations if name not in self.ended}


def samples(registry_or_collector: CollectorRegistry | NodeSliceCollector) -> Samples:
    registry = registry_or_collector
    if isinstance(registry, NodeSliceCollector):
        registry = CollectorRegistry()
        registry.register(registry_or_collector)
    return parse(generate_latest(registry).decode())


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def slice_labels(namespace: str, gpu: int, *, pod: str = "", claim: str = "") -> frozenset:
    """A slice's labels as the text has them (empty ones too; Prometheus drops those on ingestion)."""
    labels = {"namespace": namespace, "pod": pod, "container": "", "claim": claim, "gpu": str(gpu)}
    return frozenset(labels.items())


def write_region(env: Mapping[str, str], used_by_gpu: list[tuple[int, int]], **counters: int) -> Path:
    """The region at the container's GPUSLICE_SHIM_REGION, as its shim would have written it."""
    path = Path(env["GPUSLICE_SHIM_REGION"])
    devices = [DeviceUsage(g, int(env["GPUSLICE_GPU_MEMORY_BYTES"]), used, 0, 0, 0, **counters)
               for g, used in used_by_gpu]  # fmt: skip
    path.write_bytes(bytes(pack_region(devices)))
    return path


@pytest.fixture
def node(tmp_path: Path):
    """A started shim-sharing device plugin on a DGX-1, its fake kubelet and API, and its collector."""
    socket_dir = tmp_path / "dp"
    socket_dir.mkdir()
    kubelet = FakeKubelet(socket_dir)
    kubelet.start()
    api = LiveApi()
    plugins: list[DevicePlugin] = []

    def make() -> DevicePlugin:
        plugin = DevicePlugin(
            dgx1_machine(), NODE, pods=api, node=api, socket_dir=socket_dir, state_dir=tmp_path / "state",
            sharing="shim", split_count=4, watch_interval_s=0.05,
        )  # fmt: skip
        plugin.start()
        plugins.append(plugin)
        return plugin

    yield make, kubelet, api
    for plugin in plugins:
        plugin.stop()
    kubelet.stop()


def give(
    plugin: DevicePlugin, kubelet: FakeKubelet, api: LiveApi, name: str, gpus: tuple[int, ...], mib: int
) -> dict[str, str]:
    """Bind pod ml/<name> with a decision for ``gpus`` and ``mib`` per GPU; Allocate it; its environment."""
    machine = plugin.machine
    uuids = tuple(machine.gpus[g].uuid for g in gpus)
    api.bind("ml", name, Decision(NODE, "main", gpus, uuids, memory_mib=mib, cores_percent=25))
    stub = kubelet.dial(plugin.resources[0].endpoint)
    (container,) = allocate(stub, [share(machine, g) for g in gpus]).container_responses
    return dict(container.envs)


def test_allocated_pods_show_their_use_under_the_gpus_the_plugin_gave(node, monkeypatch):
    monkeypatch.setattr(node_metrics, "LIVE_TTL_S", 0.0)
    make, kubelet, api = node
    plugin = make()
    collector = device_plugin_collector(plugin, api, simulated=True)
    train = give(plugin, kubelet, api, "train", (2,), 4096)
    pair = give(plugin, kubelet, api, "pair", (0, 3), 1024)
    write_region(train, [(2, 3 * GiB)], oom_refusals=5)
    write_region(pair, [(0, 100 * MiB), (3, 200 * MiB)])

    s = samples(collector)
    assert s[("gpuslice_pod_memory_used_bytes", slice_labels("ml", 2, pod="train"))] == 3 * GiB
    assert s[("gpuslice_pod_oom_refusals_total", slice_labels("ml", 2, pod="train"))] == 5
    assert s[("gpuslice_pod_memory_limit_bytes", slice_labels("ml", 2, pod="train"))] == 4096 * MiB
    assert s[("gpuslice_pod_compute_limit_ratio", slice_labels("ml", 3, pod="pair"))] == 0.25
    assert s[("gpuslice_pod_memory_used_bytes", slice_labels("ml", 3, pod="pair"))] == 200 * MiB
    gpu2 = frozenset({("gpu", "2"), ("uuid", plugin.machine.gpus[2].uuid), ("model", "V100M16")})
    assert s[("gpuslice_gpu_slices", gpu2)] == 1
    assert s[("gpuslice_gpu_memory_shim_used_bytes", gpu2)] == 3 * GiB
    assert s[("gpuslice_node_plugin_registered", frozenset())] == 1

    # the pod's annotations now name another GPU (a user may edit them): the record still says GPU 2
    moved = {"gpuslice.io/gpu-indices": "5", "gpuslice.io/gpu-uuids": plugin.machine.gpus[5].uuid}
    api.pod_annotations[("ml", "train")].update(moved)
    again = samples(collector)
    assert again[("gpuslice_pod_memory_used_bytes", slice_labels("ml", 2, pod="train"))] == 3 * GiB


def test_a_pod_that_ended_has_no_series_at_the_next_scrape_and_leaves_the_record_later(node, monkeypatch):
    monkeypatch.setattr(node_metrics, "LIVE_TTL_S", 0.0)
    make, kubelet, api = node
    plugin = make()
    collector = device_plugin_collector(plugin, api, simulated=True)
    write_region(give(plugin, kubelet, api, "done", (1,), 1024), [(1, GiB)])
    assert ("gpuslice_pod_memory_used_bytes", slice_labels("ml", 1, pod="done")) in samples(collector)

    api.ended.add("done")
    assert not [k for k in samples(collector) if ("pod", "done") in k[1]]
    record = plugin.state_dir / ALLOCATION_RECORD
    assert "uid-done" in record.read_text()  # a list may lag a bind: the entry waits PRUNE_AFTER_S
    monkeypatch.setattr(record_module, "PRUNE_AFTER_S", 0.0)
    samples(collector)
    assert json.loads(record.read_text())["slices"] == []


def test_the_record_outlives_a_plugin_restart(node, monkeypatch):
    monkeypatch.setattr(node_metrics, "LIVE_TTL_S", 0.0)
    make, kubelet, api = node
    first = make()
    write_region(give(first, kubelet, api, "kept", (4,), 2048), [(4, 7 * MiB)])
    first.stop()
    second = make()
    s = samples(device_plugin_collector(second, api, simulated=True))
    assert s[("gpuslice_pod_memory_used_bytes", slice_labels("ml", 4, pod="kept"))] == 7 * MiB


def test_the_live_pods_are_listed_at_most_once_per_ttl(node):
    make, _kubelet, api = node
    collector = device_plugin_collector(make(), api, simulated=True)
    for _ in range(5):
        samples(collector)
    assert api.lists == 1


def test_registered_drops_when_the_kubelet_removes_the_socket_and_returns_with_registration(node):
    make, kubelet, api = node
    plugin = make()
    collector = device_plugin_collector(plugin, api, simulated=True)
    registered = ("gpuslice_node_plugin_registered", frozenset())
    assert samples(collector)[registered] == 1
    kubelet.stop()  # the kubelet goes away with its socket ...
    (plugin.socket_dir / plugin.resources[0].endpoint).unlink()  # ... and deletes the plugins' sockets
    assert samples(collector)[registered] == 0
    kubelet.start()  # back: the plugin's watcher serves and registers again
    assert wait_until(lambda: samples(collector)[registered] == 1)


def test_a_new_pod_of_an_old_pods_name_starts_from_a_fresh_region(node, monkeypatch):
    """A StatefulSet's pod comes back under its name: the region of the one before (its limit, its
    counters) must not become the new pod's."""
    monkeypatch.setattr(node_metrics, "LIVE_TTL_S", 0.0)
    make, kubelet, api = node
    plugin = make()
    region = write_region(give(plugin, kubelet, api, "web-0", (1,), 1024), [(1, GiB)], oom_refusals=9)
    api.pod_annotations.pop(("ml", "web-0"))
    give(plugin, kubelet, api, "web-0", (1,), 2048)
    assert not region.exists()


def test_the_device_plugins_metrics_port_serves_the_node_series(tmp_path):
    socket_dir = tmp_path / "dp"
    socket_dir.mkdir()
    kubelet = FakeKubelet(socket_dir)
    kubelet.start()
    api, stop, ready = LiveApi(), threading.Event(), threading.Event()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {
        "simulated": True, "pods": api, "node": api, "socket_dir": socket_dir, "sharing": "shim",
        "state_dir": tmp_path / "state", "stop": stop, "on_ready": lambda _: ready.set(),
        "metrics_port": port, "metrics_host": "127.0.0.1",
    }  # fmt: skip
    thread = threading.Thread(target=serve, args=(dgx1_machine(), NODE), kwargs=options)
    thread.start()
    try:
        assert ready.wait(TIMEOUT_S)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT_S) as reply:
            s = parse(reply.read().decode())
    finally:
        stop.set()
        thread.join(timeout=TIMEOUT_S)
        kubelet.stop()
    assert s[("gpuslice_node_plugin_registered", frozenset())] == 1
    assert len([k for k in s if k[0] == "gpuslice_gpu_slices"]) == 8
    assert any(k[0] == "gpuslice_device_plugin_device_healthy" for k in s)  # beside the health it had


# ---- the DRA driver ----------------------------------------------------------------------------------


def test_dra_claims_show_under_their_claim_and_leave_when_unprepared():
    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))  # socket paths: 107 bytes at most
    claims = Claims()
    claims.add("infer", "uid-i", [result("gpu-3", consumedCapacity={"memory": "10Gi", "cores": "30"})])
    claims.add("whole", "uid-w", [result("gpu-5")])
    node = start(root, claims, sharing="shim")
    try:
        preparer = node.plugin.preparer
        collector = dra_collector(preparer.machine, preparer, node.plugin, simulated=True)
        assert node.prepare(("infer", "uid-i"), ("whole", "uid-w")).claims["uid-i"].error == ""
        env = dict(line.split("=", 1) for line in node.spec("uid-i")["containerEdits"]["env"])
        write_region(env, [(3, 6 * GiB)], oom_refusals=2)

        s = samples(collector)
        infer = slice_labels("team", 3, claim="infer")
        assert s[("gpuslice_pod_memory_used_bytes", infer)] == 6 * GiB
        assert s[("gpuslice_pod_memory_limit_bytes", infer)] == 10 * GiB
        assert s[("gpuslice_pod_compute_limit_ratio", infer)] == 0.3
        assert s[("gpuslice_pod_oom_refusals_total", infer)] == 2
        # a whole GPU has no shim: its grant (all of the GPU's memory) and no usage
        whole = slice_labels("team", 5, claim="whole")
        assert s[("gpuslice_pod_memory_limit_bytes", whole)] == preparer.machine.gpus[5].memory_bytes
        assert ("gpuslice_pod_memory_used_bytes", whole) not in s
        assert s[("gpuslice_node_plugin_registered", frozenset())] == 0  # the kubelet has not said yes

        node.unprepare(("infer", "uid-i"))
        assert not [k for k in samples(collector) if ("claim", "infer") in k[1]]
    finally:
        node.plugin.stop()
        shutil.rmtree(root, ignore_errors=True)
