"""The chart's DRA path on the real node, installed again after the uninstall: the node labelled for
DRA instead of the device plugin, the driver DaemonSet's pod registers with the kubelet and publishes
the node's ResourceSlices, the allocator Deployment decides a user's claim, and the kubelet has the
driver's pod prepare it before the user's container starts (the slice reaches the container only
where the runtime applies CDI: containerd 1.7+; Debian 12's 1.6 does not)."""

from __future__ import annotations

import sys
import time

import pytest
from controlplane import wait_for
from install_helpers import NAMESPACE, NODE, RELEASE, REPO, Cluster, create_claim_pod, pool_slices

from gpuslice.k8s.dra.kube import GROUP, VERSION

pytestmark = [pytest.mark.k8s_e2e, pytest.mark.timeout(1200)]


def test_the_dra_driver_daemonset_prepares_a_claim_the_allocator_decided(
    installed: Cluster, user_namespace: str
) -> None:
    core = installed.core()
    core.patch_node(
        NODE, {"metadata": {"labels": {"gpuslice.io/gpu-node": None, "gpuslice.io/dra-node": "true"}}}
    )
    start = time.monotonic()
    installed.helm(
        "upgrade", "--install", RELEASE, str(REPO / "deploy" / "helm" / "gpuslice"), "--namespace", NAMESPACE,
        "--wait", "--timeout", "10m", *installed.set_args(),
    )  # fmt: skip
    daemon = installed.apps().read_namespaced_daemon_set("gpuslice-dra-driver", NAMESPACE)
    assert daemon.status.number_ready == daemon.status.desired_number_scheduled == 1, installed.describe()
    wait_for(lambda: pool_slices(installed), 120, "the driver pod's ResourceSlices for the node")
    print(
        f"\nhelm install (DRA node) -> driver Ready, slices published: {time.monotonic() - start:.1f} s",
        file=sys.stderr,
    )

    create_claim_pod(installed, user_namespace, "share", memory="4Gi", cores="30")
    running = wait_for(
        lambda: (p := core.read_namespaced_pod("share", user_namespace)).status.phase == "Running" and p,
        240,
        "the claim's pod Running",
    )
    stored = installed.objects().get_namespaced_custom_object(
        GROUP, VERSION, user_namespace, "resourceclaims", "share"
    )
    (result,) = stored["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == NODE == running.spec.node_name and result["shareID"]  # gpuslice's allocator
    (driver,) = core.list_namespaced_pod(NAMESPACE, label_selector="app=gpuslice-dra-driver").items
    log = installed.node.container_log(NAMESPACE, driver.metadata.name, driver.metadata.uid, "dra-driver")
    assert f"prepared claim {user_namespace}/share" in log
