"""Placement stays gpuslice's under DRA, on the real kube-scheduler v1.37: pods gated by
``gpuslice.io/dra-allocate`` get their claims allocated by ``gpuslice k8s dra-allocator`` (the placement
policy picks node and GPUs), and kube-scheduler binds them to exactly that node, keeping the allocation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from controlplane import ControlPlane, Process
from dra_helpers import DraNode, allocator_process, claim, claim_pod, dra_nodes, dra_scheduler, objects
from e2e_helpers import wait_for

from gpuslice.k8s.dra.allocator import GATE
from gpuslice.k8s.dra.classes import CLASS_SHARED, CLASS_WHOLE
from gpuslice.k8s.dra.kube import GROUP, VERSION

pytestmark = pytest.mark.k8s_e2e
__all__ = ["dra_scheduler"]

NODES = {"place-a": "dgx-h100", "place-b": "dgx-h100", "place-c": "pcie-4x-l4"}


@pytest.fixture(scope="module")
def nodes(
    plane: ControlPlane, core: Any, api_client: Any, dra_scheduler: Any
) -> Iterator[dict[str, DraNode]]:
    yield from dra_nodes(plane, core, api_client, NODES)


@pytest.fixture(scope="module")
def allocator(plane: ControlPlane, nodes: Any) -> Iterator[Process]:
    yield from allocator_process(plane, "dra-allocator", "hami-spread")


def make(api_client: Any, core: Any, namespace: str, name: str, body: dict[str, Any], **pod: Any) -> None:
    objects(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", body)
    core.create_namespaced_pod(namespace, claim_pod(name, name, gates=(GATE,), **pod))


def allocation(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    c = objects(api_client).get_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", name)
    return (c.get("status") or {}).get("allocation") or {}


def test_gated_claims_are_placed_by_the_policy_and_bound_there(
    allocator: Process, api_client: Any, core: Any, namespace: str
) -> None:
    # hami-spread puts each share on the least used GPU; kube-scheduler's own allocator would stack
    # them all on the first GPU of the first node that fits.
    for k in range(4):
        make(
            api_client,
            core,
            namespace,
            f"s{k}",
            claim(f"s{k}", CLASS_SHARED, capacity={"memory": "8Gi", "cores": "20"}),
        )
    make(
        api_client,
        core,
        namespace,
        "w",
        claim("w", CLASS_WHOLE, count=2, match_attribute="gpu.gpuslice.io/nvlinkDomain"),
    )

    def bound() -> dict[str, str] | None:
        found = {
            n: core.read_namespaced_pod(n, namespace).spec.node_name for n in ["s0", "s1", "s2", "s3", "w"]
        }
        return found if all(found.values()) else None

    nodes_of = wait_for(bound, 180, "the gated pods to be allocated by gpuslice and bound")
    placed = {}
    for name, node in nodes_of.items():
        got = allocation(api_client, namespace, name)
        term = got["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
        assert term["values"] == [node]  # kube-scheduler bound the pod where gpuslice allocated
        placed[name] = [(r["pool"], r["device"]) for r in got["devices"]["results"]]
        pod = core.read_namespaced_pod(name, namespace)
        assert not pod.spec.scheduling_gates
    shares = [placed[f"s{k}"][0] for k in range(4)]
    assert len(set(shares)) == 4, shares  # spread over four GPUs: the policy decided, not first fit
    assert len(placed["w"]) == 2 and len({p for p, _ in placed["w"]}) == 1
    assert allocator.popen.poll() is None, allocator.tail()


def test_a_gated_claim_nothing_fits_keeps_its_gate_and_says_why(
    allocator: Process, api_client: Any, core: Any, namespace: str
) -> None:
    make(
        api_client,
        core,
        namespace,
        "big",
        claim("big", CLASS_SHARED, capacity={"memory": "4Ti", "cores": "10"}),
    )

    def reason() -> str:
        for e in core.list_namespaced_event(namespace).items:
            if e.involved_object.name == "big" and e.reason == "GpusliceUnplaced":
                return e.message
        return ""

    message = wait_for(reason, 120, "the allocator's reason on pod big")
    assert "0/" in message and "nodes fit" in message and "GPU memory" in message
    assert core.read_namespaced_pod("big", namespace).spec.scheduling_gates
    assert allocator.popen.poll() is None, allocator.tail()


def free_claims_of_deleted_pods(api_client: Any, core: Any, namespace: str) -> None:
    """The resource claim controller's part (no controller-manager here): a claim whose pods are gone
    loses its reservation and allocation ("" = every namespace)."""
    from kubernetes.client.exceptions import ApiException

    api = objects(api_client)
    listed = (
        api.list_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims")
        if namespace
        else api.list_cluster_custom_object(GROUP, VERSION, "resourceclaims")
    )
    for c in listed["items"]:
        where = c["metadata"]["namespace"]
        for ref in (c.get("status") or {}).get("reservedFor") or []:
            try:
                core.read_namespaced_pod(ref["name"], where)
            except ApiException as err:
                if err.status != 404:
                    raise
                api.patch_namespaced_custom_object_status(
                    GROUP, VERSION, where, "resourceclaims", c["metadata"]["name"],
                    {"status": {"reservedFor": None, "allocation": None}},
                )  # fmt: skip


def test_a_high_priority_claim_preempts_lower_priority_dra_pods(
    allocator: Process, api_client: Any, core: Any, namespace: str
) -> None:
    from kubernetes import client

    scheduling = client.SchedulingV1Api(api_client)
    for name, value in (("dra-low", 10), ("dra-high", 1000)):
        try:
            scheduling.create_priority_class(
                client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=value)
            )
        except client.exceptions.ApiException as err:
            if err.status != 409:
                raise
    low = [f"low{k}" for k in range(4)]
    for name in low:
        make(
            api_client,
            core,
            namespace,
            name,
            claim(name, CLASS_WHOLE),
            node="place-c",
            priority_class="dra-low",
        )

    def low_bound() -> bool:
        # a low pod may itself preempt a share of an earlier test (priority 0) on this node: free its claim
        free_claims_of_deleted_pods(api_client, core, "")
        return all(core.read_namespaced_pod(n, namespace).spec.node_name for n in low)

    wait_for(low_bound, 180, "the low pods", interval_s=1.0)
    make(
        api_client,
        core,
        namespace,
        "high",
        claim("high", CLASS_WHOLE, count=2),
        node="place-c",
        priority_class="dra-high",
    )

    def gone() -> list[str]:
        alive = {p.metadata.name for p in core.list_namespaced_pod(namespace).items}
        return sorted(set(low) - alive)

    wait_for(lambda: len(gone()) >= 2, 120, "the allocator to preempt low-priority pods")
    free_claims_of_deleted_pods(api_client, core, namespace)
    wait_for(lambda: core.read_namespaced_pod("high", namespace).spec.node_name, 180, "the high pod to bind")
    assert len(gone()) == 2  # the fewest that make room for two whole GPUs, and no more afterwards
    free_claims_of_deleted_pods(api_client, core, namespace)
    node = wait_for(
        lambda: core.read_namespaced_pod("high", namespace).spec.node_name, 180, "the high pod to bind"
    )
    assert node == "place-c" and len(allocation(api_client, namespace, "high")["devices"]["results"]) == 2
    assert allocator.popen.poll() is None, allocator.tail()
