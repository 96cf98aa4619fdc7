"""``helm install`` of deploy/helm/gpuslice on the real node: every component runs as a pod of the
chart's own images, and a user's pod goes through all of them (see conftest.py for the cluster)."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
from controlplane import wait_for
from install_helpers import NAMESPACE, NODE, SPLIT_COUNT, Cluster, user_pod

from gpuslice.k8s.annotations import ANNOTATION_BIND_PHASE, BIND_PHASE_ALLOCATED
from gpuslice.k8s.decision import Decision
from gpuslice.units import MiB

pytestmark = [pytest.mark.k8s_e2e, pytest.mark.timeout(2400)]

OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
WORKLOADS = {
    "Deployment": ("gpuslice-scheduler", "gpuslice-webhook", "gpuslice-dra-allocator"),
    "DaemonSet": ("gpuslice-device-plugin",),
}


def _ready_pods(cluster: Cluster, app: str) -> list[Any]:
    pods = cluster.core().list_namespaced_pod(NAMESPACE, label_selector=f"app={app}").items
    return [
        p
        for p in pods
        if p.status.phase == "Running" and all(c.ready for c in p.status.container_statuses or [])
    ]


def test_every_component_of_the_chart_runs_ready_from_the_local_images(installed: Cluster) -> None:
    apps = installed.apps()
    for name in WORKLOADS["Deployment"]:
        deployment = apps.read_namespaced_deployment(name, NAMESPACE)
        assert deployment.status.ready_replicas == deployment.spec.replicas, (name, installed.describe())
        assert _ready_pods(installed, name), name
    daemon = apps.read_namespaced_daemon_set("gpuslice-device-plugin", NAMESPACE)
    assert daemon.status.desired_number_scheduled == daemon.status.number_ready == 1
    (pod,) = _ready_pods(installed, "gpuslice-device-plugin")
    assert pod.spec.node_name == NODE and pod.status.pod_ip.startswith("10.244.77.")
    # the device plugin in its pod registered with the kubelet through the hostPath socket
    shares = str(4 * SPLIT_COUNT)
    wait_for(
        lambda: (installed.core().read_node(NODE).status.allocatable or {}).get("gpuslice.io/gpu") == shares,
        120,
        "the node's gpuslice.io/gpu shares from the DaemonSet's device plugin",
    )
    # the webhook's two replicas answer on the pod network, behind their Service
    slices = installed.plane.kubectl(
        "get", "endpointslices", "-n", NAMESPACE, "-l", "kubernetes.io/service-name=gpuslice-webhook",
        "-o", "jsonpath={.items[*].endpoints[*].addresses[0]}",
    ).stdout.split()  # fmt: skip
    assert len(slices) == 2 and all(a.startswith("10.244.77.") for a in slices)


def _values(text: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def test_a_users_share_pod_is_mutated_scheduled_allocated_and_fenced_by_the_installed_chart(
    installed: Cluster, user_namespace: str
) -> None:
    """The chart's webhook names its scheduler, the chart's kube-scheduler + extender bind it, the
    DaemonSet's device plugin answers the kubelet's Allocate, and inside the container the shim holds a
    program to its 64 MiB: refused with CUDA_ERROR_OUT_OF_MEMORY there, and given the same again after
    freeing."""
    core = installed.core()
    start = time.monotonic()
    pod = user_pod("share", "env; echo '--- fill'; driver_client fill 1048576", {"gpuslice.io/gpumem": "64"})
    created = core.create_namespaced_pod(user_namespace, pod)
    assert created.spec.scheduler_name == "gpuslice-scheduler"  # mutated by the chart's webhook
    done = wait_for(
        lambda: (
            (p := core.read_namespaced_pod("share", user_namespace)).status.phase in ("Succeeded", "Failed")
            and p
        ),
        300,
        "the user's pod to end",
    )
    print(f"\nuser pod: create -> Succeeded {time.monotonic() - start:.1f} s", file=sys.stderr)
    assert done.status.phase == "Succeeded", installed.describe()
    decision = Decision.from_annotations(done.metadata.annotations or {})
    assert decision is not None and decision.node == NODE == done.spec.node_name
    assert done.metadata.annotations[ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATED  # Allocate ran
    log = installed.node.container_log(user_namespace, "share", done.metadata.uid, "main")
    env_text, _, fill_text = log.partition("--- fill\n")
    env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(64 * MiB) and env["GPUSLICE_SHARING"] == "shim"
    assert env["GPUSLICE_GPUS"] == ",".join(map(str, decision.gpu_indices))
    out = _values(fill_text)
    assert int(out["refused_with"]) == OOM and int(out["held"]) == int(out["held_again"]) == 64 * MiB
