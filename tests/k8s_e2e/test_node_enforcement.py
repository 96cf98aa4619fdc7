"""Enforcement inside the container on the real node: the native shim and the fake CUDA driver, both
mounted by the device plugin (the fake driver stands where the NVIDIA container toolkit mounts the real
one on a GPU node), hold a program in the container to its slice: memory past it is refused with
CUDA_ERROR_OUT_OF_MEMORY, and two pods at 30 % and 70 % of one GPU get their compute shares."""

from __future__ import annotations

from typing import Any

import pytest
from kubelet_node_helpers import DevicePluginProcess, decision_of, node_pod, pod_log, wait_phase

from gpuslice.units import MiB
from node import Node

pytestmark = pytest.mark.k8s_e2e

OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
SHARE_TOLERANCE = 0.10  # the bound: within 10 points of the slice's share
KERNELS = 1500  # 1 ms kernels: 1.5 s of GPU time, 5 s of wall time at 30 %


def _values(text: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def test_inside_the_container_the_shim_refuses_past_the_slice_and_allows_within(
    device_plugin: DevicePluginProcess, node: Node, core: Any, node_namespace: str
) -> None:
    """A 64 MiB slice: 1 MiB allocations are refused with CUDA_ERROR_OUT_OF_MEMORY at 64 MiB, and a
    second pass after freeing gets the same 64 MiB again (the budget is released)."""
    script = "driver_client fill 1048576"
    core.create_namespaced_pod(node_namespace, node_pod("fill", script, resources={"gpuslice.io/gpumem": 64}))
    wait_phase(core, node_namespace, "fill", ("Succeeded",))
    out = _values(pod_log(node, core, node_namespace, "fill"))
    assert int(out["refused_with"]) == OOM
    assert int(out["held"]) == 64 * MiB
    assert int(out["held_again"]) == 64 * MiB
    assert int(out["full_total"]) == 64 * MiB  # cuMemGetInfo shows the slice, not the GPU


def test_two_pods_at_30_and_70_percent_of_one_gpu_get_their_shares_measured_inside(
    device_plugin: DevicePluginProcess, node: Node, core: Any, node_namespace: str
) -> None:
    """Both pods are created at once: the extender's node lock lets one through bind to Allocate at a
    time, so the device plugin's Allocate always knows whose slice it answers with (docs/kubernetes.md,
    the node lock). Each must measure its own share inside its container, and they run together."""
    script = f"driver_client launch kernel {KERNELS} 1000"
    for name, cores in (("thirty", 30), ("seventy", 70)):
        resources = {"gpuslice.io/gpumem": 1000, "gpuslice.io/gpucores": cores}
        core.create_namespaced_pod(node_namespace, node_pod(name, script, resources=resources))
    pods = {
        name: wait_phase(core, node_namespace, name, ("Succeeded",), 300) for name in ("thirty", "seventy")
    }
    gpus = {name: decision_of(pod).gpu_indices for name, pod in pods.items()}
    assert gpus["thirty"] == gpus["seventy"]  # bestfit packs them onto one GPU: 30 + 70 = 100 %
    logs = {name: _values(pod_log(node, core, node_namespace, name)) for name in pods}
    starts = [float(v["start_s"]) for v in logs.values()]
    ends = [float(v["end_s"]) for v in logs.values()]
    assert max(starts) < min(ends)  # they overlapped
    measured = {name: float(values["share"]) for name, values in logs.items()}
    assert abs(measured["thirty"] - 0.30) <= SHARE_TOLERANCE, measured
    assert abs(measured["seventy"] - 0.70) <= SHARE_TOLERANCE, measured
