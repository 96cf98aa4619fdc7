"""The chart on a real node, installed as a cluster admin installs it (``helm install``).

A plane of its own (a second pytest session in ``scripts/k8s-e2e``, after the other e2e tests: the
kubelet's device-plugin folder is fixed, one node per machine):

```text
PodNetwork (network.py)    bridge gse2e0 10.244.77.1/24, Debian's bridge + host-local CNI plugins
ControlPlane               etcd, kube-apiserver on 10.244.77.1 (pods reach it there), ServiceAccount
                           admission on, webhook Services dialled at their endpoints (no kube-proxy)
kube-controller-manager    every default controller: Deployments, DaemonSets, EndpointSlices, service
                           accounts and kube-root-ca.crt, garbage collection, namespaces, claims
Node                       containerd + runc + the kubelet, pods on the bridge; the images of
                           scripts/build-image (gpuslice, kube-scheduler) and the e2e's pause and tools
helm install gpuslice      the chart with kubernetesService = the API server's address and a simulated
                           machine for the device plugin (the fake NVML stands in for the GPUs)
```
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "e2e" / "k8s"))  # the harness lives beside its Go build

from controlplane import ControlPlane, Process, binaries_dir, wait_for  # noqa: E402
from images import TOOLS_IMAGE, build_images, built_component_images  # noqa: E402
from network import GATEWAY, PodNetwork  # noqa: E402

from node import Node, node_ready  # noqa: E402

NODE = "inst"  # short: the DRA plugin's sockets under the node's folder stay within gRPC's 105 characters
SIMULATE = "pcie-4x-l4"  # four L4s (fake NVML)
SPLIT_COUNT = 10
RELEASE, NAMESPACE = "gpuslice", "gpuslice-system"
DEFAULT_SCHEDULER = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "leaderElection": {"leaderElect": False},
}


@dataclass
class Cluster:
    """What the install tests share: the plane, its node, the API client and the chart's values."""

    plane: ControlPlane
    node: Node
    network: PodNetwork
    controller_manager: Process
    api: Any
    values: dict[str, str]
    install_s: float = 0.0

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.plane.helm(*args, check=check)

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api)

    def objects(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def describe(self) -> str:
        """Every pod's state and the namespace's events, the kubelet's last lines: why something is not
        Ready, for a failure's message."""
        core = self.core()
        lines = []
        for pod in core.list_pod_for_all_namespaces().items:
            states = [
                f"{c.name}: ready={c.ready} restarts={c.restart_count} "
                f"{c.state.waiting or c.state.terminated or ''}"
                for c in pod.status.container_statuses or []
            ]
            lines.append(f"{pod.metadata.namespace}/{pod.metadata.name} {pod.status.phase} {states}")
        for event in core.list_event_for_all_namespaces().items[-30:]:
            lines.append(f"event {event.involved_object.name}: {event.reason} {event.message}")
        kubelet = self.node.kubelet.tail(30) if self.node.kubelet is not None else ""
        return "\n".join(lines) + "\nkubelet:\n" + kubelet

    def set_args(self) -> list[str]:
        return [arg for key, value in self.values.items() for arg in ("--set", f"{key}={value}")]


def _chart_images(work: Path) -> dict[str, Path]:
    """{image name: OCI archive}: the node's pause and tools images, gpuslice's and kube-scheduler's."""
    return {**build_images(work), **built_component_images(binaries_dir())}


def user_pod(name: str, script: str, limits: dict[str, str]) -> dict[str, Any]:
    """A pod as a user writes it: no scheduler name, no node, no host network; the webhook does the rest."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": TOOLS_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    "resources": {"requests": {"cpu": "10m"}, "limits": limits},
                }
            ],
        },
    }


def running_pod(core: Any, namespace: str, name: str) -> Any:
    """The pod, once it runs with every container ready; None before (for ``wait_for``)."""
    pod = core.read_namespaced_pod(name, namespace)
    statuses = pod.status.container_statuses or []
    return pod if pod.status.phase == "Running" and statuses and all(s.ready for s in statuses) else None


def pool_slices(cluster: Cluster) -> list[dict[str, Any]]:
    """gpuslice's DRA driver's ResourceSlices of the node."""
    from gpuslice.k8s.dra.kube import GROUP, VERSION
    from gpuslice.k8s.dra.slices import DRIVER

    found = cluster.objects().list_cluster_custom_object(
        GROUP, VERSION, "resourceslices", field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}"
    )
    return list(found["items"])


def gpuslice_keys(mapping: dict[str, str] | None) -> set[str]:
    return {k for k in mapping or {} if k.startswith("gpuslice.io/")}


def release_objects(cluster: Cluster) -> list[str]:
    """Every object helm made for the release, cluster-wide, that is still there."""
    found = cluster.plane.kubectl(
        "get", "all,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,configmaps,secrets,"
        "mutatingwebhookconfigurations,validatingadmissionpolicies,validatingadmissionpolicybindings,"
        "deviceclasses,jobs", "-A", "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name",
    ).stdout.split()  # fmt: skip
    hooks = cluster.plane.kubectl(
        "get", "jobs,serviceaccounts,roles,rolebindings", "-n", NAMESPACE, "-o", "name"
    ).stdout.split()
    return [*found, *(h for h in hooks if "uninstall" in h)]


def create_claim_pod(cluster: Cluster, namespace: str, name: str, memory: str, cores: str) -> None:
    """A ResourceClaim for a share of one GPU (``memory``, ``cores``) and a pod that uses it, gated for
    gpuslice's DRA allocator, as a user writes them for a node labelled for DRA."""
    from gpuslice.k8s.dra.allocator import GATE
    from gpuslice.k8s.dra.classes import CLASS_SHARED
    from gpuslice.k8s.dra.kube import GROUP, VERSION

    claim = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": CLASS_SHARED, "count": 1, "allocationMode": "ExactCount",
            "capacity": {"requests": {"memory": memory, "cores": cores}}}}]}},
    }  # fmt: skip
    cluster.objects().create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", claim)
    pod = user_pod(name, "env; sleep 3600", {})
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "10m"}, "claims": [{"name": "gpu"}]}
    cluster.core().create_namespaced_pod(namespace, pod)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    from kubernetes import client, config

    folder = binaries_dir()
    if folder is None:
        pytest.fail("no Kubernetes binaries: run these tests with scripts/k8s-e2e (it builds them)")
    plane = ControlPlane(folder, address=GATEWAY, pod_tokens=True)  # not started: its folder only
    network = PodNetwork(plane.root / "pod-network")  # removed with the plane's folder
    try:
        network.up()
    except BaseException:
        plane.stop()
        raise
    node: Node | None = None
    try:
        plane.start()
        manager = plane.start_controller_manager()
        plane.start_scheduler(DEFAULT_SCHEDULER)  # the cluster's own, for the chart's pods
        api = config.new_client_from_config(str(plane.kubeconfig))
        node = Node(plane, NODE, _chart_images(plane.root / "images"), network=network)
        node.start()
        core = client.CoreV1Api(api)
        wait_for(
            lambda: node_ready(core, NODE, untainted=True),
            180,
            f"node {NODE} Ready, its not-ready taint lifted",
        )
        core.patch_node(NODE, {"metadata": {"labels": {"gpuslice.io/gpu-node": "true"}}})
        values = {
            "kubernetesService.host": network.gateway,
            "kubernetesService.port": str(plane.apiserver_port),
            "devicePlugin.simulate": SIMULATE,
            "devicePlugin.sharing": "shim",  # the native shim fences memory in the container
            "devicePlugin.splitCount": str(SPLIT_COUNT),
            "devicePlugin.stateDir": str(node.root / "gpuslice-state"),
            "dra.kubeletPluginsDir": str(node.kubelet_dir / "plugins"),
            "dra.kubeletRegistryDir": str(node.kubelet_dir / "plugins_registry"),
            "dra.cdiDir": str(node.root / "cdi"),
            "dra.stateDir": str(node.root / "gpuslice-state"),
            "dra.simulate": SIMULATE,
        }
        yield Cluster(plane, node, network, manager, api, values)
    finally:
        if node is not None:
            node.stop()
        plane.stop()
        network.down()


@pytest.fixture(scope="session")
def installed(cluster: Cluster) -> Cluster:
    """``helm install`` as the README tells a user, waiting until every Deployment and DaemonSet is Ready."""
    start = time.monotonic()
    done = cluster.helm(
        "install", RELEASE, str(REPO / "deploy" / "helm" / "gpuslice"),
        "--namespace", NAMESPACE, "--create-namespace", "--wait", "--timeout", "10m",
        *cluster.set_args(), check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"helm install exited {done.returncode}: {done.stderr}\n{cluster.describe()}")
    cluster.install_s = time.monotonic() - start
    print(f"\nhelm install -> every workload Ready: {cluster.install_s:.1f} s", file=sys.stderr)
    return cluster


@pytest.fixture
def user_namespace(installed: Cluster) -> Iterator[str]:
    """A fresh namespace (kube-controller-manager gives it its default service account), its pods
    deleted and gone after the test."""
    from kubernetes import client

    core = installed.core()
    name = f"user-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(
        lambda: core.list_namespaced_service_account(name).items, 60, f"{name}'s default service account"
    )
    yield name
    core.delete_collection_namespaced_pod(name)
    wait_for(lambda: not core.list_namespaced_pod(name).items, 120, f"the pods of {name} to be gone")
