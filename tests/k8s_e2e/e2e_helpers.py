"""Fixtures and helpers of the end-to-end tests: a real control plane (``controlplane.py``) with gpuslice's
extender and webhook running as the processes users start, and nodes registered as the device plugin
and the kubelet would register them.

Run through ``scripts/k8s-e2e`` (it builds the upstream binaries and sets GPUSLICE_K8S_BIN). The tests
are deselected from a plain ``pytest`` run (pyproject's addopts ``-m "not k8s_e2e"``).
"""

from __future__ import annotations

import base64
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.k8s.device_plugin import DevicePlugin, NodeKubeClient, default_mig_layouts
from gpuslice.node.discovery import discover

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "e2e" / "k8s"))  # the control-plane harness lives beside its Go build

from controlplane import ControlPlane, Process, binaries_dir, free_port, wait_http  # noqa: E402
from controlplane import wait_for as wait_for  # noqa: E402  (the tests import it from here)

DEPLOY = REPO / "deploy" / "kubernetes"
GPUSLICE = str(Path(sys.executable).parent / "gpuslice")  # the console script pip installed


def deploy_docs(name: str) -> list[dict[str, Any]]:
    """The YAML documents of one deploy/kubernetes file."""
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def scheduler_config(extender_port: int) -> dict[str, Any]:
    """The KubeSchedulerConfiguration users deploy (20-scheduler.yaml's ConfigMap), with only the
    extender's address rewritten to where the test runs it."""
    config_map = next(d for d in deploy_docs("20-scheduler.yaml") if d["kind"] == "ConfigMap")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    for extender in config["extenders"]:
        extender["urlPrefix"] = f"http://127.0.0.1:{extender_port}"
    return config


@pytest.fixture(scope="session")
def plane() -> Iterator[ControlPlane]:
    folder = binaries_dir()
    if folder is None:
        pytest.fail(
            "the Kubernetes e2e tests need the upstream binaries: run scripts/k8s-e2e (it builds them and "
            "sets GPUSLICE_K8S_BIN)"
        )
    plane = ControlPlane(folder)
    pids = os.environ.get("GPUSLICE_E2E_PIDS")
    if pids:  # scripts/k8s-e2e kills these process groups if pytest itself is killed
        original = plane.spawn

        def spawn(*args: Any, **kwargs: Any) -> Process:
            proc = original(*args, **kwargs)
            with open(pids, "a") as out:
                out.write(f"{proc.popen.pid}\n")
            return proc

        plane.spawn = spawn  # type: ignore[method-assign]
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def api_client(plane: ControlPlane) -> Any:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


@pytest.fixture(scope="session")
def core(api_client: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client)


@dataclass
class Stack:
    """gpuslice's processes on the control plane."""

    plane: ControlPlane
    extender: Process
    extender_port: int
    scheduler: Process
    scheduler_port: int
    webhook: Process
    webhook_port: int
    ca_pem: bytes
    extender_args: tuple[str, ...]

    def restart_extender(self, *, kill: bool = True) -> None:
        """kill -9 (or stop) the extender and start it again on the same port: state from the API."""
        if kill:
            self.extender.kill()
        else:
            self.extender.stop()
        self.plane.processes.remove(self.extender)
        self.extender = start_extender(self.plane, self.extender_port, *self.extender_args)


def start_extender(plane: ControlPlane, port: int, *args: str) -> Process:
    return plane.start_extender(GPUSLICE, port, *args)


def webhook_configuration(url: str, ca_pem: bytes) -> dict[str, Any]:
    """30-webhook.yaml's MutatingWebhookConfiguration, its service reference replaced by ``url`` (no
    Service network here), a real caBundle, and a name of its own."""
    config = next(d for d in deploy_docs("30-webhook.yaml") if d["kind"] == "MutatingWebhookConfiguration")
    config["metadata"]["name"] = "gpuslice-e2e"  # test_e2e_deploy applies the deployed one beside it
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}
    return config


def webhook_certificate(folder: Path) -> tuple[Path, Path, bytes]:
    """A fresh CA and a 127.0.0.1 serving certificate for a webhook: (cert file, key file, CA PEM)."""
    import trustme

    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    folder.mkdir()
    cert, key = folder / "tls.crt", folder / "tls.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    return cert, key, ca.cert_pem.bytes()


@pytest.fixture(scope="session")
def stack(plane: ControlPlane, api_client: Any, core: Any) -> Iterator[Stack]:
    from kubernetes import client

    try:  # the deploy tests may have applied the manifests, namespace included, already
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="gpuslice")))
    except client.exceptions.ApiException as err:
        if err.status != 409:
            raise
    cert, key, ca_pem = webhook_certificate(plane.root / "webhook")
    webhook_port = free_port()
    webhook = plane.spawn(
        "webhook",
        [
            GPUSLICE,
            "k8s",
            "webhook",
            "--cert",
            str(cert),
            "--key",
            str(key),
            "--host",
            "127.0.0.1",
            "--port",
            str(webhook_port),
        ],
    )
    wait_http(f"https://127.0.0.1:{webhook_port}/healthz", 90, insecure=True, proc=webhook)
    client.AdmissionregistrationV1Api(api_client).create_mutating_webhook_configuration(
        webhook_configuration(f"https://127.0.0.1:{webhook_port}/mutate", ca_pem)
    )
    extender_port = free_port()
    extender_args = ("--policy", "bestfit")
    extender = start_extender(plane, extender_port, *extender_args)
    scheduler, scheduler_port = plane.start_scheduler(scheduler_config(extender_port))
    yield Stack(
        plane,
        extender,
        extender_port,
        scheduler,
        scheduler_port,
        webhook,
        webhook_port,
        ca_pem,
        extender_args,
    )


# ---- nodes ------------------------------------------------------------------------------------------------


@dataclass
class RegisteredNode:
    name: str
    plugin: DevicePlugin


def register_node(
    core: Any, api_client: Any, name: str, simulate: str, *, split_count: int = 10, taint: str = ""
) -> RegisteredNode:
    """A Node as a GPU node's kubelet and the gpuslice device plugin make it: the kubelet registers the
    node and reports each device-plugin resource's healthy device count as capacity; the device plugin
    (the real code, talking to this API server) publishes its inventory annotation and GPU labels."""
    from kubernetes import client

    machine = discover(simulate)
    layouts = default_mig_layouts(machine)
    kube = NodeKubeClient(api_client=api_client)
    plugin = DevicePlugin(
        machine,
        name,
        pods=kube,
        node=kube,
        split_count=split_count,
        mig_layouts=layouts,
        state_dir=tempfile.mkdtemp(prefix=f"gpuslice-e2e-{name}-"),  # the soft-cap file goes here
    )
    spec = client.V1NodeSpec(
        taints=[client.V1Taint(key=taint, value="true", effect="NoSchedule")] if taint else None
    )
    labels = {"kubernetes.io/hostname": name}
    if taint:
        labels[taint] = "true"  # the tests that tolerate the taint select the nodes by it too
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels), spec=spec))
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    for resource in plugin.resources:
        capacity[resource.name] = str(len(resource.devices))
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "e2e",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                    }
                ],
            }
        },
    )
    # The API server taints every new node not-ready (TaintNodesByCondition); the node lifecycle
    # controller lifts it once the kubelet reports Ready. No controller-manager runs here: lift it.
    core.patch_node(name, {"spec": {"taints": [t.to_dict() for t in spec.taints or []] or None}})
    plugin.publish_inventory()
    return RegisteredNode(name, plugin)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---- pods -------------------------------------------------------------------------------------------


def gpu_pod(
    name: str,
    resources: Mapping[str, str | int],
    *,
    annotations: Mapping[str, str] | None = None,
    priority_class: str | None = None,
    cpu: str = "100m",
    memory: str = "",
    grace_s: int | None = None,
    tolerate: str = "",
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod asking for gpuslice resources as a user writes it (the webhook fills in the rest)."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/job:1",
                "resources": {
                    "requests": {"cpu": cpu, **({"memory": memory} if memory else {})},
                    "limits": {k: str(v) for k, v in resources.items()},
                },
            }
        ]
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_s
    if tolerate:
        spec["tolerations"] = [{"key": tolerate, "operator": "Exists", "effect": "NoSchedule"}]
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": spec,
    }


@pytest.fixture
def namespace(core: Any) -> str:
    """A fresh namespace per test (namespaces are never finalized without a controller-manager)."""
    from kubernetes import client

    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name
