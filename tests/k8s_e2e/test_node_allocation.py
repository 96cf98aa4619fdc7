"""Share pods on the real node: kube-scheduler binds them through the extender, the kubelet asks the real
device plugin for GetPreferredAllocation and Allocate, and the container it starts sees exactly what the
decision says (environment, mounts, device nodes), read from inside the container."""

from __future__ import annotations

from typing import Any

import pytest
from kubelet_node_helpers import DevicePluginProcess, decision_of, node_pod, parse_env, pod_log, wait_phase

from gpuslice.k8s.annotations import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_BIND_PHASE,
    ANNOTATION_NODE_INVENTORY,
    BIND_PHASE_ALLOCATED,
    NodeInventory,
)
from gpuslice.units import MiB
from node import Node

pytestmark = pytest.mark.k8s_e2e

CONTROL = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
INSPECT = 'env; echo "--- devices"; ls /dev | grep nvidia; echo "--- mounts"; cat /proc/self/mountinfo'


def _mounts(text: str) -> dict[str, str]:
    """mountinfo lines -> {mount point: its options}."""
    found = {}
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 5:
            found[fields[4]] = fields[5]
    return found


def _uuids(core: Any, node: str, gpus: tuple[int, ...]) -> list[str]:
    inventory = NodeInventory.from_json(core.read_node(node).metadata.annotations[ANNOTATION_NODE_INVENTORY])
    return [inventory.gpus[g].uuid for g in gpus]


def test_a_share_pod_sees_exactly_the_env_mounts_and_devices_of_its_decision(
    device_plugin: DevicePluginProcess, node: Node, core: Any, node_namespace: str
) -> None:
    resources = {"gpuslice.io/gpumem": 6000, "gpuslice.io/gpucores": 30}
    core.create_namespaced_pod(node_namespace, node_pod("share", INSPECT, resources=resources))
    pod = wait_phase(core, node_namespace, "share", ("Succeeded",))
    decision = decision_of(pod)
    assert decision.node == pod.spec.node_name
    assert pod.metadata.annotations[ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATED  # Allocate ran
    assert pod.metadata.annotations[ANNOTATION_ALLOCATED] == "true"
    assert device_plugin.proc is not None
    plugin_log = device_plugin.proc.tail(400)
    assert "preferred allocation for gpuslice.io/gpu" in plugin_log  # the kubelet asked
    assert f"allocated gpuslice.io/gpu for pod {node_namespace}/share" in plugin_log

    env_text, _, rest = pod_log(node, core, node_namespace, "share").partition("--- devices\n")
    devices_text, _, mounts_text = rest.partition("--- mounts\n")
    env, mounts = parse_env(env_text), _mounts(mounts_text)
    gpus = tuple(decision.gpu_indices)
    uuids = _uuids(core, decision.node, gpus)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert env["GPUSLICE_GPU_UUIDS"] == ",".join(uuids)
    assert env["GPUSLICE_GPUS"] == ",".join(map(str, gpus))
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(6000 * MiB) == str(decision.memory_mib * MiB)
    assert env["GPUSLICE_COMPUTE_PERCENT"] == "30" == str(decision.cores_percent)
    assert env["GPUSLICE_SHARING"] == "shim"
    # the shim and the fake driver, read-only; the pod's own region folder, writable
    lib = env["LD_PRELOAD"].rsplit("/", 1)[0]
    assert "ro" in mounts[lib].split(",")
    assert env["LD_LIBRARY_PATH"].startswith(lib)
    assert "rw" in mounts[env["GPUSLICE_SHIM_DIR"]].split(",")
    assert env["GPUSLICE_SHIM_DIR"].endswith(f"{node_namespace}.share")
    assert set(devices_text.split()) == {f"nvidia{g}" for g in gpus} | CONTROL


def test_two_app_containers_and_an_init_container_each_get_their_own_slice_from_the_kubelet(
    device_plugin: DevicePluginProcess, node: Node, core: Any, node_namespace: str
) -> None:
    """Per-container requests through the real kubelet: it calls Allocate once per asking container (the
    init container first), and each container sees its own slice; the init container runs inside the
    first app container's slice, within its own limits."""
    pod = node_pod("multi", "env", resources={"gpuslice.io/gpumem": 6000, "gpuslice.io/gpucores": 30})
    main = pod["spec"]["containers"][0]
    side = {**main, "name": "side", "resources": {"requests": {"cpu": "10m"}, "limits": {
        "gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "3000", "gpuslice.io/gpucores": "20"}}}  # fmt: skip
    warm = {**main, "name": "warm", "resources": {"requests": {"cpu": "10m"}, "limits": {
        "gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "2000", "gpuslice.io/gpucores": "10"}}}  # fmt: skip
    pod["spec"]["containers"].append(side)
    pod["spec"]["initContainers"] = [warm]
    core.create_namespaced_pod(node_namespace, pod)
    done = wait_phase(core, node_namespace, "multi", ("Succeeded",))
    decision = decision_of(done)
    assert [(c.container, c.inside) for c in decision.containers] == [
        ("warm", True), ("main", False), ("side", False),
    ]  # fmt: skip
    assert done.metadata.annotations[ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATED
    assert done.metadata.annotations["gpuslice.io/allocated-containers"] == "3"
    for want in decision.containers:
        env = parse_env(node.container_log(node_namespace, "multi", done.metadata.uid, want.container))
        assert env["GPUSLICE_GPUS"] == ",".join(map(str, want.gpu_indices)), want.container
        assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(want.memory_mib * MiB), want.container
        assert env["GPUSLICE_COMPUTE_PERCENT"] == str(want.cores_percent), want.container
        assert env["GPUSLICE_SHIM_DIR"].endswith(f"{node_namespace}.multi_{want.container}")  # slice_folder
    assert decision.containers[0].gpu_indices == decision.containers[1].gpu_indices  # inside main's slice
