"""Metrics of the Kubernetes components: the extender's latency and decisions, the device plugin's
device and GPU health (read from a real DevicePlugin object after health changes)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.k8s.health import HealthChange
from gpuslice.node.machine import GpuInfo, Machine
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
