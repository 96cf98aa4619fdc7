"""Fixtures for the observability tests: every metric the registries export, with its type and labels."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.ledger.placement import RefusalCode
from gpuslice.observe.cluster_metrics import ClusterCollector, ClusterFigures
from gpuslice.observe.k8s_metrics import DeviceHealthRow, DevicePluginMetrics, ExtenderMetrics
from gpuslice.observe.metrics import GpuState, PendingState, ServeMetrics, ServeSnapshot, SliceState
from gpuslice.observe.node_slices import NodeSliceCollector, SliceHolder
from gpuslice.observe.reasons import FailureCode
from gpuslice.shim.region import DeviceUsage, pack_region

INTERNAL_LABELS = {"le"}  # histogram buckets


def full_snapshot() -> ServeSnapshot:
    """A snapshot with every series present (a reading on every GPU, a slice, a pending job)."""
    return ServeSnapshot(
        gpus=[GpuState(0, "GPU-a", "H100", 80, 10, True, 50.0, 10, 50.0, 300.0)],
        slices=[SliceState("1", "ml", 0, 10, 0.5, 5)],
        pending=[PendingState("ml", "normal", 1, 1.0)],
        jobs_by_state={"RUNNING": 1},
        info={"version": "0", "machine": "m", "sharing": "soft", "simulated": "true"},
    )


def exported() -> dict[str, tuple[str, frozenset[str]]]:
    """{exposed name: (type, labels)} over the serve, extender, device-plugin and node-slice registries."""
    serve = ServeMetrics(full_snapshot)
    serve.started("normal", 1.0)
    serve.preempted("ml", "low")
    serve.pending_reasons([("1", RefusalCode.INSUFFICIENT_GPU_MEMORY)])
    serve.job_failed(FailureCode.EXIT_CODE)
    serve.enforced("warn", "ml")
    serve.fault(0, "GPU-a", "H100", "xid")
    serve.anomaly(0, "GPU-a", "H100", "temperature")
    plugin = DevicePluginMetrics(
        lambda: [DeviceHealthRow("gpuslice.io/gpu", "GPU-a::0", 0, True)],
        lambda: [(0, "GPU-a", "H100", True)],
    )
    registries: list[CollectorRegistry] = [serve.registry, ExtenderMetrics().registry, plugin.registry]
    registries.append(cluster_registry())
    with tempfile.TemporaryDirectory() as folder:
        registries.append(node_slices_registry(Path(folder)))
        return _families(registries)


def cluster_registry() -> CollectorRegistry:
    """The ledger's cluster families (extender, DRA allocator): one node, one pod pending, one preempted."""
    one = np.array([1])
    figures = ClusterFigures(
        ["n"], ["H100"], one, one, one, one, one, np.array([1.0]), pending={"quota": (1, 5.0)}, preemptions=1
    )
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: figures))
    return registry


def node_slices_registry(folder: Path) -> CollectorRegistry:
    """The node's slice metrics with one shim slice whose region exists, on a GPU NVML reads."""
    region = folder / "job.region"
    region.write_bytes(pack_region([DeviceUsage(0, 1, 1, 1, 1, 1, 1)]))
    machine = Machine("n", (GpuInfo(0, "GPU-a", "H100", 80),))
    holder = SliceHolder("ml", (0,), 10, 0.5, region, pod="p")
    registry = CollectorRegistry()
    registry.register(NodeSliceCollector(machine, lambda: [holder], lambda: True, nvml_used=lambda: {0: 5}))
    return registry


def _families(registries: list[CollectorRegistry]) -> dict[str, tuple[str, frozenset[str]]]:
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


@pytest.fixture(scope="session")
def exported_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """{exposed name: (type, labels)} of serve, the extender and the device plugin."""
    return exported()
