"""What the kubelet holds agrees with what the extender decided, and stays so across restarts: the
PodResources API lists each running pod with exactly its decision's GPUs; a kubelet restart, a
``kill -9`` of the device plugin and an extender restart leave running pods their devices and give
nothing twice; a pod deleted while it starts gives its slice back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Stack, wait_for
from node_helpers import (
    NODE_NAME,
    SPLIT_COUNT,
    DevicePluginProcess,
    allocatable,
    decision_of,
    node_pod,
    pod_resources,
    running_pod,
)

from gpuslice.k8s.annotations import ANNOTATION_NODE_INVENTORY, NodeInventory
from gpuslice.k8s.device_plugin import SHARE_SEPARATOR
from node import Node

pytestmark = pytest.mark.k8s_e2e

GPU = "gpuslice.io/gpu"
SHARE = {"gpuslice.io/gpumem": 2000, "gpuslice.io/gpucores": 20}


def _inventory(core: Any) -> NodeInventory:
    return NodeInventory.from_json(core.read_node(NODE_NAME).metadata.annotations[ANNOTATION_NODE_INVENTORY])


def assert_kubelet_agrees(
    core: Any, node: Node, namespace: str, work: Path
) -> dict[tuple[str, str], list[str]]:
    """Every running pod of ``namespace``: PodResources lists it with one share device on each GPU of
    its decision, and no device is held twice across all pods. Returns {pod: device IDs}."""
    listed = pod_resources(node, work)
    uuids = [g.uuid for g in _inventory(core).gpus]
    held: dict[tuple[str, str], list[str]] = {}
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.status.phase != "Running":
            continue
        key = (namespace, pod.metadata.name)
        assert key in listed, f"PodResources does not list {key}: {sorted(listed)}"
        ids = listed[key][GPU]
        decided = [uuids[g] for g in decision_of(pod).gpu_indices]
        assert sorted(i.split(SHARE_SEPARATOR)[0] for i in ids) == sorted(decided), (key, ids, decided)
        held[key] = ids
    every = [i for devices in listed.values() for i in devices.get(GPU, [])]
    assert len(every) == len(set(every)), f"a device is held twice: {sorted(every)}"
    return held


def _registrations(plugin: DevicePluginProcess) -> int:
    assert plugin.proc is not None
    return plugin.proc.tail(10_000).count(f"registered {GPU}")


def test_pod_resources_list_agrees_with_the_extenders_decisions(
    device_plugin: DevicePluginProcess, node: Node, core: Any, node_namespace: str, tmp_path: Path
) -> None:
    for i in range(4):
        running_pod(core, node_namespace, f"share-{i}", SHARE)
    running_pod(core, node_namespace, "whole", {GPU: 1})
    held = assert_kubelet_agrees(core, node, node_namespace, tmp_path)
    assert len(held) == 5


def test_a_kubelet_restart_keeps_running_pods_their_devices_and_the_plugin_registers_again(
    device_plugin: DevicePluginProcess, node: Node, core: Any, node_namespace: str, tmp_path: Path
) -> None:
    before = running_pod(core, node_namespace, "long", SHARE)
    container = before.status.container_statuses[0].container_id
    held = assert_kubelet_agrees(core, node, node_namespace, tmp_path)
    registered = _registrations(device_plugin)

    node.stop_kubelet()
    node.start_kubelet()
    wait_for(lambda: _registrations(device_plugin) > registered, 120, "the plugin to register again")
    wait_for(
        lambda: allocatable(core, GPU) == str(4 * SPLIT_COUNT), 120, "the kubelet to report the shares again"
    )

    # the kubelet has synced the pod again once PodResources lists it; its container must still be the
    # one started before the restart, running in containerd all along (the API status may lag)
    wait_for(
        lambda: (node_namespace, "long") in pod_resources(node, tmp_path),
        120,
        "the kubelet to list the pod again",
    )
    assert container.removeprefix("containerd://") in node.running_containers()
    after = core.read_namespaced_pod("long", node_namespace)
    assert after.status.phase == "Running"
    assert after.status.container_statuses[0].container_id == container  # the same container, never restarted
    assert after.status.container_statuses[0].restart_count == 0
    assert assert_kubelet_agrees(core, node, node_namespace, tmp_path) == held  # its devices kept
    running_pod(core, node_namespace, "after", SHARE)  # a new pod is given devices nobody holds
    assert len(assert_kubelet_agrees(core, node, node_namespace, tmp_path)) == 2


def test_a_device_plugin_kill_9_and_restart_keeps_running_pods_and_serves_new_ones(
    device_plugin: DevicePluginProcess, node: Node, core: Any, node_namespace: str, tmp_path: Path
) -> None:
    container = running_pod(core, node_namespace, "long", SHARE).status.container_statuses[0].container_id
    held = assert_kubelet_agrees(core, node, node_namespace, tmp_path)
    device_plugin.stop(kill=True)
    device_plugin.start()
    wait_for(
        lambda: allocatable(core, GPU) == str(4 * SPLIT_COUNT), 120, "the kubelet to report the shares again"
    )
    assert container.removeprefix("containerd://") in node.running_containers()
    assert assert_kubelet_agrees(core, node, node_namespace, tmp_path) == held
    running_pod(core, node_namespace, "after", SHARE)
    assert len(assert_kubelet_agrees(core, node, node_namespace, tmp_path)) == 2


def test_an_extender_restart_while_pods_run_gives_nothing_twice(
    stack: Stack,
    device_plugin: DevicePluginProcess,
    node: Node,
    core: Any,
    node_namespace: str,
    tmp_path: Path,
) -> None:
    # three whole GPUs held: after the restart the extender must learn them from the API and give the
    # next whole-GPU pod the fourth, and a fifth must wait
    for i in range(3):
        running_pod(core, node_namespace, f"whole-{i}", {GPU: 1})
    stack.restart_extender()
    running_pod(core, node_namespace, "whole-3", {GPU: 1})
    gpus = [decision_of(p).gpu_indices for p in core.list_namespaced_pod(node_namespace).items]
    assert sorted(g for indices in gpus for g in indices) == [0, 1, 2, 3]
    core.create_namespaced_pod(node_namespace, node_pod("whole-4", "sleep 3600", resources={GPU: 1}))
    wait_for(
        lambda: any(
            c.type == "PodScheduled" and c.status == "False"
            for c in core.read_namespaced_pod("whole-4", node_namespace).status.conditions or []
        ),
        60,
        "the fifth whole-GPU pod to be found unschedulable",
    )
    assert core.read_namespaced_pod("whole-4", node_namespace).spec.node_name is None
    assert len(assert_kubelet_agrees(core, node, node_namespace, tmp_path)) == 4


def test_a_pod_deleted_while_it_starts_gives_its_slice_back(
    device_plugin: DevicePluginProcess, node: Node, core: Any, node_namespace: str, tmp_path: Path
) -> None:
    for i in range(3):
        running_pod(core, node_namespace, f"whole-{i}", {GPU: 1})
    core.create_namespaced_pod(node_namespace, node_pod("doomed", "sleep 3600", resources={GPU: 1}))
    wait_for(
        lambda: core.read_namespaced_pod("doomed", node_namespace).spec.node_name, 60, "doomed to be bound"
    )
    core.delete_namespaced_pod("doomed", node_namespace)  # bound, its container not yet (or just) started
    wait_for(
        lambda: "doomed" not in {p.metadata.name for p in core.list_namespaced_pod(node_namespace).items},
        120,
        "the kubelet to remove the deleted pod",
    )
    assert (node_namespace, "doomed") not in pod_resources(node, tmp_path)
    # the fourth GPU is free again for the extender, the kubelet's device manager and the API alike
    pod = running_pod(core, node_namespace, "next", {GPU: 1})
    assert pod.spec.node_name == NODE_NAME
    assert len(assert_kubelet_agrees(core, node, node_namespace, tmp_path)) == 4
