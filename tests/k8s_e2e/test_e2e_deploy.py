"""The deploy artifacts themselves, with the real helm and kubectl: the chart lints and renders with the
default values and with every knob turned, the kustomize base builds, both are applied to the real API
server, and the device plugin's account can change only its own node."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane
from e2e_helpers import REPO

pytestmark = pytest.mark.k8s_e2e

CHART = REPO / "deploy" / "helm" / "gpuslice"
KUBE_VERSION = "v1.37.2"  # helm template renders for Kubernetes v1.20 unless told; the chart needs >= 1.30
KUSTOMIZE = REPO / "deploy" / "kubernetes"
CUSTOM_VALUES = {
    "image": {"repository": "registry.example/gpuslice", "tag": "9.9.9"},
    "scheduler": {
        "kubeSchedulerImage": {"tag": "v1.36.3"},
        "policy": "fgd",
        "decide": False,
        "weight": 50,
        "extenderPort": 9999,
    },
    "webhook": {"replicas": 3, "failurePolicy": "Ignore", "existingSecret": "my-tls", "caBundle": "Q0E="},
    "devicePlugin": {"splitCount": 4, "stateDir": "/srv/gpuslice", "runtimeClassName": "nvidia"},
}


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name))


def containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        c
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet")
        for c in o["spec"]["template"]["spec"]["containers"]
    ]


@pytest.fixture(scope="module")
def custom_values(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("values") / "custom.yaml"
    path.write_text(yaml.safe_dump(CUSTOM_VALUES))
    return path


def test_helm_lint_passes_with_default_and_custom_values(plane: ControlPlane, custom_values: Path) -> None:
    plane.helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION)
    plane.helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, "-f", str(custom_values))


def test_chart_renders_and_matches_the_kustomize_base_where_it_should(plane: ControlPlane) -> None:
    rendered = docs(
        plane.helm(
            "template", "gpuslice", str(CHART), "--namespace", "gpuslice", "--kube-version", "v1.35.2"
        ).stdout
    )
    kinds = sorted({o["kind"] for o in rendered})
    assert "ValidatingAdmissionPolicy" in kinds and "MutatingWebhookConfiguration" in kinds
    scheduler = next(c for c in containers(rendered) if c["name"] == "kube-scheduler")
    # the scheduler image follows the cluster's version
    assert scheduler["image"] == "registry.k8s.io/kube-scheduler:v1.35.2"
    hook = by_kind(rendered, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["failurePolicy"] == "Fail" and hook["matchConditions"]
    assert json.loads(json.dumps(hook["clientConfig"]["caBundle"]))  # generated, base64
    base = docs(plane.kubectl("kustomize", str(KUSTOMIZE)).stdout)
    base_hook = by_kind(base, "MutatingWebhookConfiguration")["webhooks"][0]
    assert [" ".join(c["expression"].split()) for c in base_hook["matchConditions"]] == [
        " ".join(c["expression"].split()) for c in hook["matchConditions"]
    ]
    config = yaml.safe_load(
        by_kind(rendered, "ConfigMap", "gpuslice-scheduler-config")["data"]["config.yaml"]
    )
    base_config = yaml.safe_load(
        by_kind(base, "ConfigMap", "gpuslice-scheduler-config")["data"]["config.yaml"]
    )
    assert config["percentageOfNodesToScore"] == base_config["percentageOfNodesToScore"] == 100


def test_custom_values_reach_every_place_they_belong(plane: ControlPlane, custom_values: Path) -> None:
    rendered = docs(
        plane.helm(
            "template", "gpuslice", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(custom_values)
        ).stdout
    )
    plugin_set = by_kind(rendered, "DaemonSet")
    pod = plugin_set["spec"]["template"]["spec"]
    container = pod["containers"][0]
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "state")
    command = container["command"]
    assert state["hostPath"]["path"] == mount["mountPath"] == command[command.index("--state-dir") + 1]
    assert mount["mountPath"] == "/srv/gpuslice"
    assert command[command.index("--split-count") + 1] == "4"
    assert pod["runtimeClassName"] == "nvidia"
    extender = next(c for c in containers(rendered) if c["name"] == "extender")
    assert "--no-decide" in extender["command"] and "fgd" in extender["command"]
    assert extender["readinessProbe"]["exec"]["command"][-1] == "http://127.0.0.1:9999/healthz"
    scheduler = next(c for c in containers(rendered) if c["name"] == "kube-scheduler")
    assert scheduler["image"].endswith(":v1.36.3")
    assert not any(o["kind"] == "Secret" for o in rendered)  # existingSecret: none generated
    hook = by_kind(rendered, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == "Q0E=" and hook["failurePolicy"] == "Ignore"


def test_no_probe_targets_loopback_from_the_node(plane: ControlPlane, custom_values: Path) -> None:
    """An httpGet probe comes from the kubelet on the node: host 127.0.0.1 is the node itself, never the
    pod (unless hostNetwork), so such a pod would never become Ready."""
    for text in (
        plane.helm("template", "gpuslice", str(CHART), "--kube-version", KUBE_VERSION).stdout,
        plane.helm(
            "template", "gpuslice", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(custom_values)
        ).stdout,
        plane.kubectl("kustomize", str(KUSTOMIZE)).stdout,
    ):
        for obj in docs(text):
            if obj["kind"] not in ("Deployment", "DaemonSet"):
                continue
            host_network = obj["spec"]["template"]["spec"].get("hostNetwork", False)
            for container in obj["spec"]["template"]["spec"]["containers"]:
                for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                    get = (container.get(probe) or {}).get("httpGet") or {}
                    assert host_network or get.get("host", "") not in ("127.0.0.1", "localhost", "::1"), (
                        f"{obj['metadata']['name']}/{container['name']} {probe}"
                    )


def test_kustomize_base_and_helm_chart_apply_to_the_real_api_server(
    plane: ControlPlane, api_client: Any
) -> None:
    from kubernetes import client

    admission = client.AdmissionregistrationV1Api(api_client)
    try:
        base = plane.kubectl("kustomize", str(KUSTOMIZE)).stdout
        plane.kubectl("apply", "-f", "-", stdin=base)
        plane.kubectl("get", "validatingadmissionpolicy", "gpuslice-device-plugin-own-node")
        # The base above already created the DeviceClasses (cluster-wide names): one owner each.
        plane.helm(
            "install",
            "gs",
            str(CHART),
            "--namespace",
            "gpuslice-helm",
            "--create-namespace",
            "--set",
            "dra.deviceClasses=false",
        )
        status = plane.helm("status", "gs", "--namespace", "gpuslice-helm", "-o", "json").stdout
        assert json.loads(status)["info"]["status"] == "deployed"
        config = admission.read_mutating_webhook_configuration("gs")
        assert config.webhooks[0].client_config.ca_bundle  # the chart made a CA
    finally:
        # Neither webhook can be reached here (no Service network): with failurePolicy Fail they would
        # refuse the other tests' gpuslice pods, so they go; the stack's own registration stays.
        # no hooks: the pre-delete Job would wait for a Job controller and a kubelet this plane has not
        plane.helm("uninstall", "gs", "--namespace", "gpuslice-helm", "--no-hooks", check=False)
        for name in ("gpuslice", "gs"):
            try:
                admission.delete_mutating_webhook_configuration(name)
            except client.exceptions.ApiException as err:
                if err.status != 404:
                    raise


def test_device_plugin_account_may_change_only_its_own_node(
    plane: ControlPlane, api_client: Any, core: Any
) -> None:
    """Applied RBAC plus the ValidatingAdmissionPolicy: a token of the device plugin's service account,
    bound to a pod on node-a, patches node-a's annotations and labels, and nothing else."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    plane.kubectl("apply", "-f", "-", stdin=plane.kubectl("kustomize", str(KUSTOMIZE)).stdout)
    plane.kubectl("delete", "mutatingwebhookconfiguration", "gpuslice", "--ignore-not-found")
    for name in ("own-node-a", "own-node-b"):
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
    pod = core.create_namespaced_pod(
        "gpuslice",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "device-plugin-on-a"},
            "spec": {
                "nodeName": "own-node-a",
                "serviceAccountName": "gpuslice-device-plugin",
                "containers": [{"name": "dp", "image": "gpuslice:0.1.0"}],
            },
        },
    )
    token = core.create_namespaced_service_account_token(
        "gpuslice-device-plugin",
        "gpuslice",
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                bound_object_ref=client.V1BoundObjectReference(
                    kind="Pod", api_version="v1", name="device-plugin-on-a", uid=pod.metadata.uid
                ),
            )
        ),
    ).status.token
    cfg = client.Configuration()
    cfg.host = plane.server
    cfg.ssl_ca_cert = str(plane.root / "pki" / "apiserver.crt")
    cfg.api_key = {"authorization": f"Bearer {token}"}
    as_plugin = client.CoreV1Api(client.ApiClient(cfg))
    patch = {
        "metadata": {"annotations": {"gpuslice.io/probe": "1"}, "labels": {"gpuslice.io/gpu.count": "8"}}
    }
    as_plugin.patch_node("own-node-a", patch)
    assert core.read_node("own-node-a").metadata.annotations["gpuslice.io/probe"] == "1"
    # A just-applied ValidatingAdmissionPolicy takes a moment to be in force: the first refusal is the
    # one judged (a patch let through before it is undone by the next probe's check, not counted).
    deadline = time.monotonic() + 60
    while True:
        try:
            as_plugin.patch_node("own-node-b", patch)
        except ApiException as err:
            other_node = err
            break
        assert time.monotonic() < deadline, "the own-node admission policy never refused node-b"
        time.sleep(0.5)
    assert other_node.status in (403, 422)
    assert "only its own node" in other_node.body
    with pytest.raises(ApiException) as taint:
        as_plugin.patch_node("own-node-a", {"spec": {"unschedulable": True}})
    assert "labels and annotations" in taint.value.body
    # RBAC: get (the node lock's read and resourceVersion) and patch, nothing more
    assert as_plugin.read_node("own-node-a").metadata.name == "own-node-a"
    with pytest.raises(ApiException) as delete:
        as_plugin.delete_node("own-node-a")
    assert delete.value.status == 403
    assert as_plugin.list_pod_for_all_namespaces(field_selector="spec.nodeName=own-node-a").items
