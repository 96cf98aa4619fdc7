"""A real node: the upstream kubelet with containerd runs a pod of a locally built image and serves its
output; the real ``gpuslice k8s device-plugin`` registers on the kubelet's socket and the kubelet, not
the test, reports the gpuslice resources in the Node's capacity and allocatable."""

from __future__ import annotations

from typing import Any

import pytest
from node_helpers import NODE_NAME, SPLIT_COUNT, DevicePluginProcess, node_pod, pod_log, wait_phase

from gpuslice.k8s.annotations import ANNOTATION_NODE_INVENTORY, NodeInventory
from node import Node

pytestmark = pytest.mark.k8s_e2e


def test_a_pod_runs_in_containerd_through_the_kubelet_and_its_output_is_read(
    node: Node, core: Any, node_namespace: str
) -> None:
    core.create_namespaced_pod(node_namespace, node_pod("hello", "echo hello from $(cat /proc/1/comm)"))
    pod = wait_phase(core, node_namespace, "hello", ("Succeeded",))
    assert pod.spec.node_name == NODE_NAME  # bound by kube-scheduler through the extender
    assert (
        pod_log(node, core, node_namespace, "hello").strip() == "hello from sh"
    )  # PID 1 of the container is the shell
    info = core.read_node(NODE_NAME).status.node_info
    assert info.kubelet_version == "v1.37.2"
    assert info.container_runtime_version.startswith("containerd://")


def test_the_device_plugin_registers_and_the_kubelet_reports_its_resources(
    device_plugin: DevicePluginProcess, core: Any
) -> None:
    assert device_plugin.proc is not None
    log = device_plugin.proc.tail(400)
    assert "registered gpuslice.io/gpu" in log
    obj = core.read_node(NODE_NAME)
    # four simulated L4s x split count: written by the kubelet from ListAndWatch, not by the test
    assert obj.status.capacity["gpuslice.io/gpu"] == str(4 * SPLIT_COUNT)
    assert obj.status.allocatable["gpuslice.io/gpu"] == str(4 * SPLIT_COUNT)
    inventory = NodeInventory.from_json(obj.metadata.annotations[ANNOTATION_NODE_INVENTORY])
    assert [g.model for g in inventory.gpus] == ["L4"] * 4
