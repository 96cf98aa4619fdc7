"""A MIG pod on the real node: the device plugin serves a simulated A100 in MIG mode (fake NVML), the
kubelet advertises its MIG resource, and a pod asking for one instance runs with exactly that instance
(its UUID as CUDA_VISIBLE_DEVICES, its GPU's device node) and the kubelet lists it as held."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import wait_for
from node_helpers import (
    SIMULATE,
    DevicePluginProcess,
    allocatable,
    decision_of,
    node_pod,
    parse_env,
    pod_log,
    pod_resources,
    wait_phase,
)

from gpuslice.node.discovery import discover
from gpuslice.node.enforcement import mig_device_uuid
from node import Node

pytestmark = pytest.mark.k8s_e2e

MIG_MACHINE = "dgx-a100:mig"  # eight A100-80GB in MIG mode, two 3g.40gb instances each by default
MIG = "gpuslice.io/mig-3g.40gb"


@pytest.fixture(scope="module")
def mig_plugin(device_plugin: DevicePluginProcess, core: Any) -> Iterator[DevicePluginProcess]:
    """The node's device plugin swapped for one on the MIG machine, and back after this module."""
    device_plugin.stop()
    device_plugin.simulate = MIG_MACHINE
    try:
        device_plugin.start()
        wait_for(lambda: allocatable(core, MIG) == "16", 120, f"the kubelet to report {MIG}")
        yield device_plugin
    finally:
        device_plugin.stop()
        device_plugin.simulate = SIMULATE
        device_plugin.start()
        wait_for(lambda: allocatable(core, "gpuslice.io/gpu") == "40", 120, "the shares to be back")


def test_a_mig_pod_runs_with_exactly_its_instance(
    mig_plugin: DevicePluginProcess, node: Node, core: Any, node_namespace: str, tmp_path: Path
) -> None:
    script = 'env; echo "--- devices"; ls /dev | grep nvidia'
    core.create_namespaced_pod(node_namespace, node_pod("mig", script, resources={MIG: 1}))
    pod = wait_phase(core, node_namespace, "mig", ("Succeeded",))
    decision = decision_of(pod)
    assert decision.mig is not None and decision.mig.profile == "3g.40gb"
    instance = mig_device_uuid(discover(MIG_MACHINE), decision.mig.gpu_index, "3g.40gb", decision.mig.start)
    log = pod_log(node, core, node_namespace, "mig")
    env_text, _, devices_text = log.partition("--- devices\n")
    env = parse_env(env_text)
    assert env["CUDA_VISIBLE_DEVICES"] == instance
    assert env["GPUSLICE_MIG_PROFILE"] == "3g.40gb"
    assert env["GPUSLICE_GPUS"] == str(decision.mig.gpu_index)
    assert set(devices_text.split()) == {
        f"nvidia{decision.mig.gpu_index}",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
    }
    # while it runs the kubelet holds that one instance for it
    core.create_namespaced_pod(node_namespace, node_pod("mig-long", "sleep 3600", resources={MIG: 1}))
    long = wait_phase(core, node_namespace, "mig-long", ("Running",))
    held = pod_resources(node, tmp_path)[(node_namespace, "mig-long")][MIG]
    choice = decision_of(long).mig
    assert choice is not None
    assert held == [mig_device_uuid(discover(MIG_MACHINE), choice.gpu_index, "3g.40gb", choice.start)]
