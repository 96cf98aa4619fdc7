"""docs/metrics.md documents every metric the registries export, and nothing else: name, type, labels."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuslice.observe.k8s_metrics import DeviceHealthRow, DevicePluginMetrics, ExtenderMetrics
from gpuslice.observe.metrics import GpuState, PendingState, ServeMetrics, ServeSnapshot, SliceState

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
INTERNAL_LABELS = {"le"}  # histogram buckets


def full_snapshot() -> ServeSnapshot:
    """A snapshot with every series present (a reading on every GPU, a slice, a pending job)."""
    return ServeSnapshot(
        gpus=[GpuState(0, "GPU-a", "H100", 80, 10, True, 50.0, 10, 50.0, 300.0)],
        slices=[SliceState("1", "ml", 0, 10, 0.5, 5)],
        pending=[PendingState("ml", "normal", 1.0)],
        jobs_by_state={"RUNNING": 1},
        info={"version": "0", "machine": "m", "sharing": "soft", "simulated": "true"},
    )


def exported() -> dict[str, tuple[str, frozenset[str]]]:
    """{exposed name: (type, labels)} over the serve, extender and device-plugin registries."""
    serve = ServeMetrics(full_snapshot)
    serve.started("normal", 1.0)
    serve.preempted("ml", "low")
    serve.pending_reasons([("1", "needs 40 GiB on one GPU; largest free is 2 GiB on GPU 0")])
    serve.job_failed("failed with exit code 1")
    serve.enforced("warn", "ml")
    serve.fault(0, "GPU-a", "H100", "xid")
    serve.anomaly(0, "GPU-a", "H100", "temperature")
    plugin = DevicePluginMetrics(
        lambda: [DeviceHealthRow("gpuslice.io/gpu", "GPU-a::0", 0, True)],
        lambda: [(0, "GPU-a", "H100", True)],
    )
    registries: list[CollectorRegistry] = [serve.registry, ExtenderMetrics().registry, plugin.registry]
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for registry in registries:
        for family in registry.collect():
            name = family.name + "_total" if family.type == "counter" else family.name
            labels = {k for s in family.samples for k in s.labels} - INTERNAL_LABELS
            assert family.samples, f"{name} exported no sample in the test snapshot"
            if name in found:  # the same gauge from two processes must mean the same thing
                assert found[name] == (family.type, frozenset(labels)), name
            found[name] = (family.type, frozenset(labels))
    return found


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| `(gpuslice_[a-z_]+)` \| (\w+) \| ([^|]*) \|", line)
        if m:
            labels = frozenset(x.strip() for x in m.group(3).split(",") if x.strip())
            assert m.group(1) not in rows, f"{m.group(1)} is documented twice"
            rows[m.group(1)] = (m.group(2), labels)
    return rows


def test_every_exported_metric_is_documented_with_its_type_and_labels():
    docs = documented()
    for name, (kind, labels) in exported().items():
        assert name in docs, f"{name} is exported but not in docs/metrics.md"
        assert docs[name] == (kind, labels), f"{name}: docs say {docs[name]}, registry has {(kind, labels)}"


def test_no_documented_metric_is_stale():
    stale = set(documented()) - set(exported())
    assert not stale, f"documented but no longer exported: {sorted(stale)}"


def test_names_follow_prometheus_conventions():
    for name, (kind, _labels) in exported().items():
        assert name.startswith("gpuslice_")
        assert (kind == "counter") == name.endswith("_total"), name
        not_base = re.search(r"_(ms|milliseconds|percent|kb|mb|gb|mib|gib)(_|$)", name)
        assert not not_base, f"{name}: not in a base unit"
