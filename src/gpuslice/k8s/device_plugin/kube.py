"""The API server as the device plugin sees it: the pods bound to this node, and the node itself."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuslice.errors import UserError
from gpuslice.k8s import kube_client
from gpuslice.k8s.annotations import (
    ANNOTATION_BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    Decision,
)

__all__ = [
    "KubeApi",
    "NodePublisher",
    "PendingPod",
    "PodSource",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod bound to this node by the extender and waiting for Allocate, with its decision."""

    namespace: str
    name: str
    decision: Decision
    created: str = ""  # metadata.creationTimestamp (RFC 3339): the kubelet admits older pods first


class PodSource(Protocol):
    """Finds the pods the extender bound to a node; marks them once Allocate used their decision."""

    def allocating_pods(self, node_name: str) -> list[PendingPod]:
        """Pods on ``node_name`` whose bind-phase is "allocating", in any order."""
        ...

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge ``annotations`` into the pod's annotations."""
        ...


class NodePublisher(Protocol):
    """Writes annotations and labels on this plugin's node."""

    def annotate_node(
        self, node_name: str, annotations: Mapping[str, str], labels: Mapping[str, str] | None = None
    ) -> None:
        """Merge ``annotations`` (and ``labels``) into the node's."""
        ...


class KubeApi:
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
        listed = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node_name},status.phase=Pending"
        )
        pods = []
        for pod in listed.items:
            annotations = pod.metadata.annotations or {}
            if annotations.get(ANNOTATION_BIND_PHASE) != BIND_PHASE_ALLOCATING:
                continue
            try:
                decision = Decision.from_annotations(annotations)
            except UserError as err:
                log.warning("pod %s/%s: %s; skipped", pod.metadata.namespace, pod.metadata.name, err)
                continue
            if decision is not None:
                created = pod.metadata.creation_timestamp
                stamp = created.strftime("%Y-%m-%dT%H:%M:%SZ") if created is not None else ""
                pods.append(PendingPod(pod.metadata.namespace, pod.metadata.name, decision, stamp))
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
