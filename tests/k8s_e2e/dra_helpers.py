"""Helpers of the DRA end-to-end tests: a kube-scheduler with only its own plugins (DRA included), nodes
served by ``gpuslice k8s dra-driver`` processes, claims and the pods that use them, and a client of the
driver's kubelet socket."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from controlplane import ControlPlane, Process
from e2e_helpers import DEPLOY, GPUSLICE, wait_for

from gpuslice.k8s.dra.kube import GROUP, VERSION
from gpuslice.k8s.dra.proto import dra_pb2 as dra
from gpuslice.k8s.dra.proto import dra_pb2_grpc as dra_grpc
from gpuslice.k8s.dra.slices import DRIVER

__all__ = [
    "DRA_SCHEDULER",
    "DraNode",
    "allocator_process",
    "claim",
    "claim_pod",
    "dra_scheduler",
    "objects",
    "start_dra_node",
]

DRA_SCHEDULER = "gpuslice-dra-e2e"  # a profile of its own: the other tests' schedulers never see these pods


@pytest.fixture(scope="session")
def dra_scheduler(plane: ControlPlane) -> Process:
    """kube-scheduler v1.37 with its default plugins, DynamicResources among them, and no extender."""
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},  # beside the gpuslice stack's scheduler
        "profiles": [{"schedulerName": DRA_SCHEDULER}],
    }
    proc, _port = plane.start_scheduler(config, name="kube-scheduler-dra")
    plane.kubectl("apply", "-f", str(DEPLOY / "50-dra-deviceclasses.yaml"))
    return proc


def objects(api_client: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api_client)


@dataclass
class DraNode:
    """A Node and the ``gpuslice k8s dra-driver`` process serving it."""

    name: str
    root: Path
    driver: Process
    argv: list[str]

    @property
    def socket(self) -> Path:
        return self.root / "plugins" / DRIVER / "dra.sock"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    def prepare(self, namespace: str, name: str, uid: str) -> dra.NodePrepareResourceResponse:
        """NodePrepareResources for one claim, as the kubelet calls it."""
        with grpc.insecure_channel(f"unix://{self.socket}") as ch:
            request = dra.NodePrepareResourcesRequest(
                claims=[dra.Claim(namespace=namespace, name=name, uid=uid)]
            )
            return dra_grpc.DRAPluginStub(ch).NodePrepareResources(request, timeout=60).claims[uid]

    def unprepare(self, namespace: str, name: str, uid: str) -> dra.NodeUnprepareResourceResponse:
        with grpc.insecure_channel(f"unix://{self.socket}") as ch:
            request = dra.NodeUnprepareResourcesRequest(
                claims=[dra.Claim(namespace=namespace, name=name, uid=uid)]
            )
            return dra_grpc.DRAPluginStub(ch).NodeUnprepareResources(request, timeout=60).claims[uid]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def start_dra_node(plane: ControlPlane, core: Any, api_client: Any, name: str, simulate: str) -> DraNode:
    """A Node as its kubelet registers it, and the DRA driver (the CLI users run) publishing its pool."""
    from kubernetes import client

    core.create_node(
        client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name}))
    )
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "e2e",
        "lastHeartbeatTime": _now(),
        "lastTransitionTime": _now(),
    }
    core.patch_node_status(
        name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}}
    )
    core.patch_node(name, {"spec": {"taints": None}})  # no node lifecycle controller lifts not-ready
    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))  # unix socket paths stay short
    argv = [
        GPUSLICE,
        "k8s",
        "dra-driver",
        "--simulate",
        simulate,
        "--node-name",
        name,
        "--kubeconfig",
        str(plane.kubeconfig),
        "--plugins-dir",
        str(root / "plugins"),
        "--registry-dir",
        str(root / "registry"),
        "--cdi-dir",
        str(root / "cdi"),
        "--state-dir",
        str(root / "state"),
    ]
    proc = plane.spawn(f"dra-driver-{name}", argv)
    node = DraNode(name, root, proc, argv)
    wait_until_serving(node, api_client)
    return node


def wait_until_serving(node: DraNode, api_client: Any) -> None:
    def ready() -> bool:
        if node.driver.popen.poll() is not None:
            raise AssertionError(f"the DRA driver exited: {node.driver.tail()}")
        return node.socket.exists() and bool(pool(api_client, node.name))

    wait_for(ready, 120, f"the DRA driver of {node.name} to publish and listen")


def restart_driver(plane: ControlPlane, node: DraNode, api_client: Any) -> None:
    """kill -9 the driver and start it again with the same state directory."""
    node.driver.kill()
    plane.processes.remove(node.driver)
    node.socket.unlink(missing_ok=True)
    node.driver = plane.spawn(f"dra-driver-{node.name}", node.argv)
    wait_until_serving(node, api_client)


def stop_dra_node(node: DraNode) -> None:
    node.driver.stop()
    shutil.rmtree(node.root, ignore_errors=True)


def pool(api_client: Any, node: str) -> list[dict[str, Any]]:
    found = objects(api_client).list_cluster_custom_object(
        GROUP, VERSION, "resourceslices", field_selector=f"spec.nodeName={node},spec.driver={DRIVER}"
    )
    return list(found["items"])


def claim(
    name: str,
    device_class: str,
    *,
    count: int = 1,
    capacity: Mapping[str, str] | None = None,
    selectors: list[str] | None = None,
    match_attribute: str = "",
) -> dict[str, Any]:
    """A ResourceClaim as a user writes it: one request ``gpu`` of ``device_class``."""
    exactly: dict[str, Any] = {
        "deviceClassName": device_class,
        "count": count,
        "allocationMode": "ExactCount",
    }
    if capacity:
        exactly["capacity"] = {"requests": dict(capacity)}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if match_attribute:
        devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": match_attribute}]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def claim_pod(
    name: str,
    claim_name: str,
    *,
    scheduler: str = DRA_SCHEDULER,
    priority_class: str = "",
    node: str = "",
    gates: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A pod whose container uses the claim ``claim_name`` (on ``node`` when given)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        "containers": [
            {
                "name": "main",
                "image": "registry.example/job:1",
                "resources": {"requests": {"cpu": "10m"}, "claims": [{"name": "gpu"}]},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def dra_nodes(
    plane: ControlPlane, core: Any, api_client: Any, specs: Mapping[str, str]
) -> Iterator[dict[str, DraNode]]:
    """Nodes name -> simulated machine, each with its driver; stopped afterwards."""
    nodes = {name: start_dra_node(plane, core, api_client, name, spec) for name, spec in specs.items()}
    try:
        yield nodes
    finally:
        for node in nodes.values():
            stop_dra_node(node)


def allocator_process(plane: ControlPlane, name: str, policy: str) -> Iterator[Process]:
    """A fixture's body: ``gpuslice k8s dra-allocator --policy POLICY`` while the fixture lives."""
    proc = plane.spawn(
        name, [GPUSLICE, "k8s", "dra-allocator", "--kubeconfig", str(plane.kubeconfig), "--policy", policy]
    )
    yield proc
    plane.forget(proc)


def dump(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False)
