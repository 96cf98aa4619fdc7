"""The chart's DRA path on the real node, installed again after the uninstall: the node labelled for
DRA instead of the device plugin, the driver DaemonSet's pod registers with the kubelet and publishes
the node's ResourceSlices, the allocator Deployment decides a user's claim, and the kubelet has the
driver's pod prepare it before the user's container starts (the slice reaches the container only
where the runtime applies CDI: containerd 1.7+; Debian 12's 1.6 does not)."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
from controlplane import wait_for
from install_helpers import NAMESPACE, NODE, RELEASE, REPO, Cluster, user_pod

from gpuslice.k8s.dra.allocator import GATE
from gpuslice.k8s.dra.classes import CLASS_SHARED
from gpuslice.k8s.dra.kube import GROUP, VERSION
from gpuslice.k8s.dra.slices import DRIVER

pytestmark = [pytest.mark.k8s_e2e, pytest.mark.timeout(1200)]


def _objects(cluster: Cluster) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(cluster.api)


def _slices(cluster: Cluster) -> list[dict[str, Any]]:
    found = _objects(cluster).list_cluster_custom_object(
        GROUP, VERSION, "resourceslices", field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}"
    )
    return list(found["items"])


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
    wait_for(lambda: _slices(installed), 120, "the driver pod's ResourceSlices for the node")
    print(
        f"\nhelm install (DRA node) -> driver Ready, slices published: {time.monotonic() - start:.1f} s",
        file=sys.stderr,
    )

    claim = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": "share"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": CLASS_SHARED, "count": 1, "allocationMode": "ExactCount",
            "capacity": {"requests": {"memory": "4Gi", "cores": "30"}}}}]}},
    }  # fmt: skip
    _objects(installed).create_namespaced_custom_object(
        GROUP, VERSION, user_namespace, "resourceclaims", claim
    )
    pod = user_pod("share", "env; sleep 3600", {})
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "share"}]
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "10m"}, "claims": [{"name": "gpu"}]}
    core.create_namespaced_pod(user_namespace, pod)
    running = wait_for(
        lambda: (p := core.read_namespaced_pod("share", user_namespace)).status.phase == "Running" and p,
        240,
        "the claim's pod Running",
    )
    stored = _objects(installed).get_namespaced_custom_object(
        GROUP, VERSION, user_namespace, "resourceclaims", "share"
    )
    (result,) = stored["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == NODE == running.spec.node_name and result["shareID"]  # gpuslice's allocator
    (driver,) = core.list_namespaced_pod(NAMESPACE, label_selector="app=gpuslice-dra-driver").items
    log = installed.node.container_log(NAMESPACE, driver.metadata.name, driver.metadata.uid, "dra-driver")
    assert f"prepared claim {user_namespace}/share" in log
