"""``helm uninstall`` takes gpuslice off the node and out of the cluster: the pre-delete hook deletes
the node DaemonSets in the foreground, their pods take back what they wrote (the node's inventory
annotation and GPU labels, the state folder, the kubelet sockets), then helm deletes the rest. Runs last:
the chart is gone after it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from controlplane import wait_for
from install_helpers import NAMESPACE, NODE, RELEASE, Cluster, gpuslice_keys, release_objects

from gpuslice.k8s.annotations import ANNOTATION_NODE_INVENTORY, LABEL_GPU_NODE
from node import DEVICE_PLUGIN_DIR

pytestmark = [pytest.mark.k8s_e2e, pytest.mark.timeout(1200)]


def test_uninstall_leaves_nothing_of_gpuslice_on_the_node_or_in_the_cluster(installed: Cluster) -> None:
    core = installed.core()
    state = Path(installed.values["devicePlugin.stateDir"])
    node = core.read_node(NODE)
    assert ANNOTATION_NODE_INVENTORY in (node.metadata.annotations or {})  # what there is to take back
    assert gpuslice_keys(node.metadata.labels) - {LABEL_GPU_NODE}
    assert (state / "shim").is_dir() and list(DEVICE_PLUGIN_DIR.glob("gpuslice-*.sock"))

    start = time.monotonic()
    done = installed.helm(
        "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "5m", check=False
    )
    assert done.returncode == 0, f"{done.stderr}\n{installed.describe()}"
    wait_for(lambda: not core.list_namespaced_pod(NAMESPACE).items, 120, "gpuslice's pods to be gone")
    print(f"\nhelm uninstall -> every pod gone: {time.monotonic() - start:.1f} s", file=sys.stderr)

    node = core.read_node(NODE)
    assert gpuslice_keys(node.metadata.annotations) == set()  # inventory, node lock
    assert gpuslice_keys(node.metadata.labels) == {LABEL_GPU_NODE}  # only the admin's own label
    wait_for(
        lambda: not (core.read_node(NODE).status.allocatable or {}).get("gpuslice.io/gpu", "0").strip("0"),
        60,
        "the kubelet to offer no gpuslice.io/gpu once the plugin is gone",
    )
    assert not list(DEVICE_PLUGIN_DIR.glob("gpuslice-*"))
    # the folder itself was the plugin's hostPath mount point: the kubelet made it, and it stays, empty
    assert not state.exists() or not list(state.iterdir()), sorted(str(p) for p in state.rglob("*"))
    assert release_objects(installed) == []
