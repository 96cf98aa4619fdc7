"""The API server as the device plugin sees it: the pods bound to this node, and the node itself."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuslice.errors import UserError
from gpuslice.k8s import kube_client, node_lock
from gpuslice.k8s.annotations import (
    ANNOTATION_BIND_PHASE,
    BIND_PHASE_ALLOCATED,
    RESOURCE_GPU,
    RESOURCE_MIG_PREFIX,
)
from gpuslice.k8s.decision import Decision

__all__ = [
    "NodeKubeClient",
    "NodePublisher",
    "PendingPod",
    "PodSource",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod on this node that may be waiting for Allocate: Pending, asking for a device of this plugin,
    not yet allocated. ``decision`` is the extender's (None: the pod reached the node without it)."""

    namespace: str
    name: str
    decision: Decision | None
    created: str = ""  # metadata.creationTimestamp (RFC 3339)
    uid: str = ""


class PodSource(Protocol):
    """Finds the pods waiting on a node; marks them once Allocate used their decision; gives back the
    node lock (``k8s.node_lock``) the extender took for the pod."""

    def allocating_pods(self, node_name: str) -> list[PendingPod]:
        """Every pod that may wait for Allocate on ``node_name`` (see ``PendingPod``), in any order:
        read from the API server itself (a consistent read), never from a cache."""
        ...

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge ``annotations`` into the pod's annotations."""
        ...

    def release_node_lock(self, node_name: str, uid: str) -> bool:
        """Clear ``node_name``'s lock if pod ``uid`` holds it; True if this call cleared it."""
        ...


class NodePublisher(Protocol):
    """Writes annotations and labels on this plugin's node."""

    def annotate_node(
        self, node_name: str, annotations: Mapping[str, str], labels: Mapping[str, str] | None = None
    ) -> None:
        """Merge ``annotations`` (and ``labels``) into the node's."""
        ...


class NodeKubeClient:
    """``PodSource`` and ``NodePublisher`` over the official ``kubernetes`` client.

    Configuration: ``kubeconfig`` if given, else the in-cluster service account (the DaemonSet), else
    ~/.kube/config. Tests may pass a ready ``kubernetes.client.ApiClient``. The DaemonSet's RBAC needs
    pods: list, patch; nodes: patch.
    """

    def __init__(self, kubeconfig: str | None = None, *, api_client: Any | None = None) -> None:
        client = kube_client.kubernetes_client_module()
        if api_client is None:
            api_client = kube_client.api_client(kubeconfig)
        self._api_client = api_client
        self.core = client.CoreV1Api(api_client)

    def close(self) -> None:
        """Close the client's connection pool."""
        self._api_client.close()

    def allocating_pods(self, node_name: str) -> list[PendingPod]:
        # Pods the kubelet is admitting are still Pending; the field selector keeps the list to this node.
        # A LIST without a resourceVersion is served from etcd: a pod bound before this call is in it.
        listed = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node_name},status.phase=Pending"
        )
        pods = []
        for pod in listed.items:
            meta = pod.metadata
            annotations = meta.annotations or {}
            if annotations.get(ANNOTATION_BIND_PHASE) == BIND_PHASE_ALLOCATED or not _asks_for_devices(pod):
                continue
            try:
                decision = Decision.from_annotations(annotations)
            except UserError as err:
                log.warning("pod %s/%s: %s; waiting without a decision", meta.namespace, meta.name, err)
                decision = None
            created = meta.creation_timestamp
            stamp = created.strftime("%Y-%m-%dT%H:%M:%SZ") if created is not None else ""
            pods.append(PendingPod(meta.namespace, meta.name, decision, stamp, str(meta.uid or "")))
        return pods

    # An object body goes out as a strategic merge patch: our annotations merge into the existing ones.
    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": dict(annotations)}})

    def annotate_node(
        self, node_name: str, annotations: Mapping[str, str], labels: Mapping[str, str] | None = None
    ) -> None:
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if labels:
            metadata["labels"] = dict(labels)
        self.core.patch_node(node_name, {"metadata": metadata})

    def release_node_lock(self, node_name: str, uid: str) -> bool:
        return node_lock.release(self, node_name, uid)

    @property
    def api_client(self) -> Any:
        return self._api_client

    def slice_holders(self, node_name: str) -> list[str]:
        """``namespace/name`` of every pod on ``node_name`` that has not ended and asks for a device of
        this plugin: its containers may still use the node's shim and job regions."""
        listed = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}")
        return [
            f"{pod.metadata.namespace}/{pod.metadata.name}"
            for pod in listed.items
            if pod.status.phase not in ("Succeeded", "Failed") and _asks_for_devices(pod)
        ]

    def live_pod_uids(self, node_name: str) -> set[str]:
        """UIDs of the pods on ``node_name`` that have not ended (their slices are still held). Read from
        the API server's watch cache (resourceVersion "0", as the kubelet lists its pods): the metrics
        ask at every scrape, and a moment's lag only delays a series' end."""
        listed = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node_name}", resource_version="0", _request_timeout=5
        )  # a scrape waits for it: 5 s at most (Prometheus' default scrape timeout is 10 s)
        return {
            str(pod.metadata.uid)
            for pod in listed.items
            if pod.status is None or pod.status.phase not in ("Succeeded", "Failed")
        }

    def read_node_annotations(self, node_name: str) -> tuple[dict[str, str], str]:
        return node_lock.read_node_annotations(self.core, node_name)

    def write_node_annotations(
        self, node_name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> None:
        node_lock.write_node_annotations(self.core, node_name, annotations, resource_version)


def _asks_for_devices(pod: Any) -> bool:
    """Does any container (init containers too) ask for a device this plugin serves?"""
    for container in [*(pod.spec.containers or []), *(pod.spec.init_containers or [])]:
        resources = container.resources
        asked = [*((resources and resources.requests) or {}), *((resources and resources.limits) or {})]
        if any(k == RESOURCE_GPU or k.startswith(RESOURCE_MIG_PREFIX) for k in asked):
            return True
    return False
