"""Fixtures and helpers of the node tests: a real kubelet + containerd node (``e2e/k8s/node.py``) on the
control plane, the real ``gpuslice k8s device-plugin`` process on it, and pods that run there.

The node is tainted (``NODE_TAINT``): only the node tests' pods, which tolerate it, land on it, so the
scheduling tests' made-up nodes and this real one do not mix.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane, Process
from e2e_helpers import GPUSLICE, Stack, wait_for
from images import TOOLS_IMAGE, build_images

from gpuslice.k8s.annotations import (
    SCHEDULER_NAME,
)
from gpuslice.k8s.decision import Decision
from node import DEVICE_PLUGIN_DIR, Node, node_ready

__all__ = [
    "NODE_NAME",
    "NODE_TAINT",
    "SIMULATE",
    "SPLIT_COUNT",
    "DevicePluginProcess",
    "allocatable",
    "device_plugin",
    "node",
    "node_namespace",
    "node_pod",
    "pod_log",
    "pod_resources",
    "running_pod",
    "start_device_plugin",
    "start_node",
    "wait_phase",
]

NODE_NAME = "e2e-node"
NODE_TAINT = "e2e.gpuslice.io/real-node"
SIMULATE = "pcie-4x-l4"  # four L4s (fake NVML): the node's GPUs
SPLIT_COUNT = 10
RUNTIME_ENV = "GPUSLICE_E2E_RUNTIME"  # runc (default) or crun (refuses a cgroup v1/v2 hybrid host)


def start_node(plane: ControlPlane, core: Any) -> Node:
    """The real node, Ready and schedulable (stopped again if it does not get there)."""
    if not (plane.bin / "kubelet").is_file():
        raise AssertionError(f"no kubelet in {plane.bin}: run scripts/k8s-e2e (it builds it)")
    images = build_images(plane.root / "images")
    real = Node(plane, NODE_NAME, images, runtime=os.environ.get(RUNTIME_ENV, "runc"), taints=(NODE_TAINT,))
    real.start()
    try:
        wait_for(lambda: node_ready(core, NODE_NAME), 180, f"node {NODE_NAME} to be registered and Ready")
        lift_not_ready_taint(core)
    except BaseException:
        real.stop()
        raise
    return real


def _stopped_at_the_end(thing: Any) -> Iterator[Any]:
    """A fixture's body: yield ``thing``, stop it however the tests ended."""
    try:
        yield thing
    finally:
        thing.stop()


@pytest.fixture(scope="session")
def node(stack: Stack, core: Any) -> Iterator[Node]:
    yield from _stopped_at_the_end(start_node(stack.plane, core))


def lift_not_ready_taint(core: Any) -> None:
    """The API server taints every new node not-ready; the node lifecycle controller (not run here)
    lifts it once the kubelet reports Ready. Do what it does: keep only the node's own taints."""
    obj = core.read_node(NODE_NAME)
    kept = [t.to_dict() for t in obj.spec.taints or [] if not t.key.startswith("node.kubernetes.io/")]
    core.patch_node(NODE_NAME, {"spec": {"taints": kept}})


@dataclass
class DevicePluginProcess:
    """``gpuslice k8s device-plugin`` on the node, as its DaemonSet runs it (fake NVML GPUs)."""

    plane: ControlPlane
    state_dir: Path
    proc: Process | None = None
    simulate: str = SIMULATE
    split_count: int = SPLIT_COUNT
    starts: int = field(default=0)

    def start(self) -> Process:
        self.starts += 1
        self.proc = self.plane.spawn(
            f"device-plugin-{self.starts}",
            [
                GPUSLICE, "k8s", "device-plugin",
                "--simulate", self.simulate,
                "--node-name", NODE_NAME,
                "--kubeconfig", str(self.plane.kubeconfig),
                "--socket-dir", str(DEVICE_PLUGIN_DIR),
                "--split-count", str(self.split_count),
                "--sharing", "shim",
                "--state-dir", str(self.state_dir),
            ],
        )  # fmt: skip
        wait_for(self.ready, 120, "the device plugin to register with the kubelet")
        return self.proc

    def ready(self) -> bool:
        if self.proc is None:
            return False
        if self.proc.popen.poll() is not None:
            raise AssertionError(
                f"the device plugin exited {self.proc.popen.returncode}:\n{self.proc.tail()}"
            )
        return "gpuslice device plugin on node" in self.proc.tail(200)

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is not None:
            if kill:
                self.proc.kill()
            self.plane.forget(self.proc)
            self.proc = None


def start_device_plugin(
    plane: ControlPlane, core: Any, split_count: int = SPLIT_COUNT
) -> DevicePluginProcess:
    """The device plugin on the node, once the kubelet reports its shares."""
    state = plane.root / "device-plugin-state"  # the plugin's hostPath state dir, gone with the plane
    plugin = DevicePluginProcess(plane, state, split_count=split_count)
    plugin.start()
    shares = str(4 * split_count)
    try:
        wait_for(lambda: allocatable(core, "gpuslice.io/gpu") == shares, 120, "the shares on the node")
    except BaseException:
        plugin.stop()
        raise
    return plugin


def allocatable(core: Any, resource: str) -> str | None:
    """The node's allocatable ``resource`` as the kubelet reports it."""
    return (core.read_node(NODE_NAME).status.allocatable or {}).get(resource)


@pytest.fixture(scope="session")
def device_plugin(node: Node, core: Any) -> Iterator[DevicePluginProcess]:
    yield from _stopped_at_the_end(start_device_plugin(node.plane, core))


# ---- pods ---------------------------------------------------------------------------------------------


def node_pod(
    name: str,
    script: str,
    *,
    resources: Mapping[str, str | int] | None = None,
    annotations: Mapping[str, str] | None = None,
    grace_s: int = 2,
) -> dict[str, Any]:
    """A pod of the tools image that runs ``script`` under sh on the real node, once, host network."""
    container: dict[str, Any] = {
        "name": "main",
        "image": TOOLS_IMAGE,
        "imagePullPolicy": "Never",  # imported into containerd; no registry
        "command": ["/bin/sh", "-c", script],
        "resources": {"requests": {"cpu": "10m"}},
    }
    if resources:
        container["resources"]["limits"] = {k: str(v) for k, v in resources.items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "containers": [container],
            "schedulerName": SCHEDULER_NAME,  # the e2e kube-scheduler runs only the gpuslice profile
            "restartPolicy": "Never",
            "hostNetwork": True,  # no CNI plugin on the node
            "terminationGracePeriodSeconds": grace_s,
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "tolerations": [{"key": NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def wait_phase(core: Any, namespace: str, name: str, phases: tuple[str, ...], timeout_s: float = 180) -> Any:
    """Until the pod reaches one of ``phases``; fails early (with its status) on an unexpected end."""

    def check() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        phase = pod.status.phase
        if phase in phases:
            return pod
        if phase in ("Succeeded", "Failed"):
            raise AssertionError(f"pod {namespace}/{name} ended {phase}: {pod.status}")
        return None

    return wait_for(check, timeout_s, f"pod {namespace}/{name} to be {' or '.join(phases)}")


def pod_log(node: Node, core: Any, namespace: str, name: str) -> str:
    """The output of the pod's container ``main``, as the runtime logged it for the kubelet."""
    pod = core.read_namespaced_pod(name, namespace)
    return node.container_log(namespace, name, pod.metadata.uid, "main")


def decision_of(pod: Any) -> Decision:
    decision = Decision.from_annotations(pod.metadata.annotations or {})
    assert decision is not None, f"pod {pod.metadata.name} has no gpuslice decision"
    return decision


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def elapsed(start: float) -> float:
    return time.monotonic() - start


# ---- the kubelet's PodResources API ----------------------------------------------------------------------


def pod_resources(node: Node, work: Path) -> dict[tuple[str, str], dict[str, list[str]]]:
    """``List`` on the kubelet's PodResources socket: {(namespace, pod): {resource: device IDs}} for the
    pods that hold devices (the stubs are compiled from proto/podresources.proto into ``work``)."""
    import grpc

    module = _podresources_stubs(work)
    with grpc.insecure_channel(f"unix://{node.pod_resources_socket}") as channel:
        listed = module.PodResourcesListerStub(channel).List(module.pb.ListPodResourcesRequest(), timeout=30)
    found: dict[tuple[str, str], dict[str, list[str]]] = {}
    for pod in listed.pod_resources:
        devices: dict[str, list[str]] = {}
        for container in pod.containers:
            for group in container.devices:
                devices.setdefault(group.resource_name, []).extend(group.device_ids)
        if devices:
            found[(pod.namespace, pod.name)] = devices
    return found


@dataclass
class _Stubs:
    pb: Any
    PodResourcesListerStub: Any


def _podresources_stubs(work: Path) -> _Stubs:
    import importlib
    import sys

    from grpc_tools import protoc

    out = work / "podresources-stubs"
    if not (out / "podresources_pb2_grpc.py").exists():
        out.mkdir(parents=True, exist_ok=True)
        proto = Path(__file__).parent / "proto"
        code = protoc.main(
            ["protoc", f"-I{proto}", f"--python_out={out}", f"--grpc_python_out={out}", "podresources.proto"]
        )
        assert code == 0, "protoc failed on podresources.proto"
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return _Stubs(
        importlib.import_module("podresources_pb2"),
        importlib.import_module("podresources_pb2_grpc").PodResourcesListerStub,
    )


@pytest.fixture
def node_namespace(namespace: str, core: Any) -> Iterator[str]:
    """A fresh namespace whose pods are deleted after the test and gone before the next one starts
    (the kubelet stops their containers and removes them), so every test finds the node's GPUs free."""
    yield namespace
    core.delete_collection_namespaced_pod(namespace)  # graceful: the kubelet stops them, then removes them
    wait_for(
        lambda: not core.list_namespaced_pod(namespace).items, 120, f"the pods of {namespace} to be gone"
    )


def running_pod(core: Any, namespace: str, name: str, resources: Mapping[str, str | int]) -> Any:
    """A pod that holds ``resources`` and sleeps, once Running."""
    core.create_namespaced_pod(namespace, node_pod(name, "sleep 3600", resources=resources))
    return wait_phase(core, namespace, name, ("Running",))
