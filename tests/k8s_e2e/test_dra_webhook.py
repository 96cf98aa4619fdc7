"""The webhook's DRA rewrite on the real API server: a pod labelled ``gpuslice.io/dra: "true"`` that
asks for ``gpuslice.io/*`` resources is admitted as a pod with a claim from a ResourceClaimTemplate of
its shape (created by the webhook), kube-controller-manager's resourceclaim controller makes the claim,
``gpuslice k8s dra-allocator`` allocates it and lifts the gate, and kube-scheduler binds the pod to
that node. A bad quantity is refused at admission with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from controlplane import ControlPlane, Process, free_port, wait_http
from dra_helpers import DRA_SCHEDULER, DraNode, allocator_process, dra_nodes, dra_scheduler, objects
from e2e_helpers import GPUSLICE, wait_for, webhook_certificate, webhook_configuration

from gpuslice.k8s.dra.kube import GROUP, VERSION
from gpuslice.k8s.dra.rewrite import CLAIM_NAME, LABEL_DRA

pytestmark = pytest.mark.k8s_e2e
__all__ = ["dra_scheduler"]

NODES = {"rewrite-a": "pcie-4x-l4"}
CONFIG = "gpuslice-dra-e2e"  # sorts before the stack's "gpuslice-e2e": called first, it strips the resources


@pytest.fixture(scope="module")
def controller_manager(plane: ControlPlane) -> Iterator[Process]:
    """kube-controller-manager with only the resourceclaim controller (claims from templates)."""
    proc = plane.start_controller_manager("resourceclaim-controller")
    yield proc
    plane.forget(proc)


@pytest.fixture(scope="module")
def dra_webhook(plane: ControlPlane, api_client: Any) -> Iterator[Process]:
    """A second ``gpuslice k8s webhook``, with ``--dra-claims label``, for labelled pods only."""
    from kubernetes import client

    cert, key, ca_pem = webhook_certificate(plane.root / "webhook-dra")
    port = free_port()
    proc = plane.spawn(
        "webhook-dra",
        [
            GPUSLICE, "k8s", "webhook", "--cert", str(cert), "--key", str(key), "--host", "127.0.0.1",
            "--port", str(port), "--dra-claims", "label", "--kubeconfig", str(plane.kubeconfig),
        ],
    )  # fmt: skip
    wait_http(f"https://127.0.0.1:{port}/healthz", 90, insecure=True, proc=proc)
    config = webhook_configuration(f"https://127.0.0.1:{port}/mutate", ca_pem)
    config["metadata"]["name"] = CONFIG
    for hook in config["webhooks"]:
        hook["objectSelector"] = {"matchLabels": {LABEL_DRA: "true"}}
        hook["sideEffects"] = "NoneOnDryRun"  # it creates the claim templates
    admission = client.AdmissionregistrationV1Api(api_client)
    admission.create_mutating_webhook_configuration(config)
    yield proc
    admission.delete_mutating_webhook_configuration(CONFIG)
    plane.forget(proc)


@pytest.fixture(scope="module")
def nodes(
    plane: ControlPlane, core: Any, api_client: Any, dra_scheduler: Any
) -> Iterator[dict[str, DraNode]]:
    yield from dra_nodes(plane, core, api_client, NODES)


@pytest.fixture(scope="module")
def allocator(plane: ControlPlane, nodes: Any) -> Iterator[Process]:
    yield from allocator_process(plane, "dra-allocator-rewrite", "bestfit")


def gpu_pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    """A pod as a user who does not write claims writes it, opted in to DRA by the label."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL_DRA: "true"}},
        "spec": {
            "schedulerName": DRA_SCHEDULER,
            "nodeSelector": {"kubernetes.io/hostname": "rewrite-a"},  # the other tests' DRA nodes stay out
            "containers": [
                {"name": "main", "image": "registry.example/job:1", "resources": {"limits": limits}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def test_a_pod_asking_for_gpuslice_resources_gets_a_claim_that_gpuslice_allocates(
    controller_manager: Process, dra_webhook: Process, allocator: Process, api_client: Any, core: Any,
    namespace: str,
) -> None:  # fmt: skip
    limits = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "4096", "gpuslice.io/gpucores": "30"}
    core.create_namespaced_pod(namespace, gpu_pod("notebook", limits))
    stored = core.read_namespaced_pod("notebook", namespace)
    assert not any(k.startswith("gpuslice.io/") for k in stored.spec.containers[0].resources.limits or {})
    (entry,) = stored.spec.resource_claims
    assert (entry.name, entry.resource_claim_template_name) == (CLAIM_NAME, "gpuslice-share-4096mi-30c")
    template = objects(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaimtemplates", "gpuslice-share-4096mi-30c"
    )
    assert (
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["cores"] == "30"
    )

    def bound() -> Any:
        pod = core.read_namespaced_pod("notebook", namespace)
        return pod if pod.spec.node_name else None

    pod = wait_for(bound, 180, "the rewritten pod to get its claim, be allocated by gpuslice and bound")
    assert pod.spec.node_name == "rewrite-a" and not pod.spec.scheduling_gates
    (made,) = pod.status.resource_claim_statuses
    claim = objects(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", made.resource_claim_name
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == "rewrite-a" and result["shareID"]  # gpuslice's allocator wrote it
    from kubernetes.utils import parse_quantity

    consumed = result["consumedCapacity"]
    assert Decimal(parse_quantity(consumed["memory"])) == 4096 * 2**20 and consumed["cores"] == "30"


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "-5"}, "not a whole non-negative number"),
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "250"}, "1..100"),
        ({"gpuslice.io/mig-9g.99gb": "1"}, "no GPU in this cluster offers MIG profile '9g.99gb'"),
        # an H200's profile: gpuslice knows it, but no GPU of this cluster (its nodes' inventories) has it
        ({"gpuslice.io/mig-1g.18gb": "1"}, "no GPU in this cluster offers MIG profile '1g.18gb'"),
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "8Gi"}, "write a plain number of MiB (8,192 if 8Gi"),
    ],
)
def test_a_bad_quantity_is_refused_at_admission_with_the_reason(
    dra_webhook: Process, core: Any, namespace: str, limits: dict[str, str], reason: str
) -> None:
    from kubernetes import client

    with pytest.raises(client.exceptions.ApiException) as refused:
        core.create_namespaced_pod(namespace, gpu_pod("bad", limits))
    assert refused.value.status == 400
    assert "gpuslice: " in refused.value.body and reason in refused.value.body, refused.value.body


def test_a_pod_where_two_containers_and_an_init_container_ask_gets_a_claim_each_on_one_node(
    controller_manager: Process, dra_webhook: Process, allocator: Process, api_client: Any, core: Any,
    namespace: str,
) -> None:  # fmt: skip
    """Each asking app container its own claim (the API server accepts the containers' claim references),
    the init container on the first; kube-controller-manager makes both claims, gpuslice allocates both
    on one node, kube-scheduler binds the pod there."""
    body = gpu_pod(
        "pair", {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "4096", "gpuslice.io/gpucores": "30"}
    )
    body["spec"]["containers"].append(
        {"name": "side", "image": "registry.example/job:1", "resources": {"limits": {"gpuslice.io/gpu": "1"}}}
    )
    body["spec"]["initContainers"] = [
        {
            "name": "fetch",
            "image": "registry.example/job:1",
            "resources": {"limits": {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "1024"}},
        }
    ]
    core.create_namespaced_pod(namespace, body)
    stored = core.read_namespaced_pod("pair", namespace)
    refs = {
        c.name: [r.name for r in c.resources.claims or []]
        for c in (*stored.spec.containers, *stored.spec.init_containers)
    }
    second = f"{CLAIM_NAME}-1"
    assert refs == {"main": [CLAIM_NAME], "side": [second], "fetch": [CLAIM_NAME]}
    assert [(e.name, e.resource_claim_template_name) for e in stored.spec.resource_claims] == [
        (CLAIM_NAME, "gpuslice-share-4096mi-30c"),
        (second, "gpuslice-whole-1"),
    ]

    def bound() -> Any:
        pod = core.read_namespaced_pod("pair", namespace)
        return pod if pod.spec.node_name else None

    pod = wait_for(bound, 180, "both claims of the two-container pod to be allocated and the pod bound")
    assert pod.spec.node_name == "rewrite-a" and not pod.spec.scheduling_gates
    made = {s.name: s.resource_claim_name for s in pod.status.resource_claim_statuses}
    results = {
        name: objects(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "resourceclaims", made[name]
        )["status"]["allocation"]["devices"]["results"]
        for name in (CLAIM_NAME, second)
    }
    assert {r["pool"] for rs in results.values() for r in rs} == {"rewrite-a"}
    (share,), (whole,) = results[CLAIM_NAME], results[second]
    assert share["consumedCapacity"]["cores"] == "30" and whole["consumedCapacity"]["cores"] == "100"
    # the whole GPU is not the one the share is on: bestfit puts a whole GPU on a free one
    assert whole["device"] != share["device"]
