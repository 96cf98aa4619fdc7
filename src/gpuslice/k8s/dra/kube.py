"""The DRA components' API server calls: the driver reads ResourceClaims and publishes its node's
ResourceSlices; the allocator lists pools, claims and gated pods, writes allocations, lifts gates.

Through the official client's generic object API (resource.k8s.io/v1 paths), so it works with any
client version that can reach a v1.34+ API server.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice.k8s.dra.slices import DRIVER
from gpuslice.k8s.kube_client import api_client, kubernetes_client_module

__all__ = ["GROUP", "VERSION", "DraApi"]

FINALIZER = "resource.kubernetes.io/delete-protection"  # kube-scheduler's own: deletion waits for release

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSION = "v1"


class DraApi:
    """``get_claim`` (a ``ClaimSource``) and ``publish`` (a node's pool) over one API client."""

    def __init__(self, kubeconfig: str | None = None, *, client: Any | None = None) -> None:
        self._client = client if client is not None else api_client(kubeconfig)
        module = kubernetes_client_module()
        self._objects = module.CustomObjectsApi(self._client)
        self._core = module.CoreV1Api(self._client)
        self._kubeconfig = kubeconfig
        self._events: Any | None = None

    @property
    def api_client(self) -> Any:
        """The kubernetes ApiClient every call here goes through."""
        return self._client

    def close(self) -> None:
        self._client.close()

    # -- the webhook's claim templates ---------------------------------------------------------------

    def ensure_template(self, namespace: str, template: Mapping[str, Any]) -> None:
        """Create the ResourceClaimTemplate unless one of its name exists (then it is left as it is)."""
        refused = kubernetes_client_module().ApiException
        try:
            self._objects.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaimtemplates", dict(template)
            )
        except refused as err:
            if err.status != 409:  # AlreadyExists: a pod of the same shape came first
                raise RuntimeError(f"the API server answered {err.status} {err.reason}") from None

    # -- the allocator -------------------------------------------------------------------------------

    def list_slices(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """gpuslice's driver's ResourceSlices; ``timeout_s`` bounds the call (None: the client's own)."""
        found = self._objects.list_cluster_custom_object(
            GROUP,
            VERSION,
            "resourceslices",
            field_selector=f"spec.driver={DRIVER}",
            _request_timeout=timeout_s,
        )
        return list(found.get("items") or [])

    def list_claims(self) -> list[dict[str, Any]]:
        return list(
            self._objects.list_cluster_custom_object(GROUP, VERSION, "resourceclaims").get("items") or []
        )

    def list_pods(self) -> list[dict[str, Any]]:
        return list(self._client.sanitize_for_serialization(self._core.list_pod_for_all_namespaces().items))

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod with its own grace period, only if it is still the one meant (same UID)."""
        body = kubernetes_client_module().V1DeleteOptions(preconditions={"uid": uid})
        try:
            self._core.delete_namespaced_pod(name, namespace, body=body)
        except kubernetes_client_module().exceptions.ApiException as err:
            if err.status not in (404, 409):
                raise

    def write_allocation(self, claim: Mapping[str, Any], allocation: Mapping[str, Any]) -> None:
        """Protect the claim as kube-scheduler does, then store the allocation at the claim's resource
        version: a claim changed meanwhile (kube-scheduler allocated it) refuses with 409."""
        meta = claim["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER not in finalizers:
            patch = {
                "metadata": {
                    "finalizers": [*finalizers, FINALIZER],
                    "resourceVersion": meta["resourceVersion"],
                }
            }
            claim = self._objects.patch_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], "resourceclaims", meta["name"], patch
            )
        body = {**claim, "status": {**(claim.get("status") or {}), "allocation": dict(allocation)}}
        self._objects.replace_namespaced_custom_object_status(
            GROUP, VERSION, meta["namespace"], "resourceclaims", meta["name"], body
        )

    def ungate(self, pod: Mapping[str, Any], gate: str) -> None:
        meta = pod["metadata"]
        gates = pod["spec"].get("schedulingGates") or []
        keep = [g for g in gates if g.get("name") != gate]
        ops = [
            {"op": "test", "path": "/spec/schedulingGates", "value": gates},
            {"op": "replace", "path": "/spec/schedulingGates", "value": keep},
        ]
        self._core.patch_namespaced_pod(meta["name"], meta["namespace"], ops)

    def pod_event(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        from gpuslice.k8s.extender.kube import KubernetesApi

        if self._events is None:
            self._events = KubernetesApi(self._kubeconfig)
        meta = pod["metadata"]
        self._events.create_event(meta["namespace"], meta["name"], meta.get("uid", ""), reason, message)

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self._objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", name)

    def pool_slices(self, node_name: str) -> list[dict[str, Any]]:
        """This driver's ResourceSlices of ``node_name`` as stored."""
        found = self._objects.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices", field_selector=f"spec.nodeName={node_name},spec.driver={DRIVER}"
        )
        return list(found.get("items") or [])

    def next_generation(self, node_name: str) -> int:
        """One more than the pool's highest stored generation (1 for a new pool)."""
        stored = [int(s["spec"]["pool"].get("generation", 0)) for s in self.pool_slices(node_name)]
        return max(stored, default=0) + 1

    def publish(self, node_name: str, slices: Sequence[Mapping[str, Any]]) -> None:
        """Make the stored pool exactly ``slices``: create or replace each, delete the rest."""
        stored = {s["metadata"]["name"]: s for s in self.pool_slices(node_name)}
        exceptions = kubernetes_client_module().exceptions
        for body in slices:
            name = body["metadata"]["name"]
            old = stored.pop(name, None)
            if old is None:
                self._objects.create_cluster_custom_object(GROUP, VERSION, "resourceslices", dict(body))
                continue
            update = {
                **body,
                "metadata": {**body["metadata"], "resourceVersion": old["metadata"]["resourceVersion"]},
            }
            self._objects.replace_cluster_custom_object(GROUP, VERSION, "resourceslices", name, update)
        for name in stored:
            try:
                self._objects.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
            except exceptions.ApiException as err:
                if err.status != 404:
                    raise
        log.info("published %d ResourceSlices of node %s", len(slices), node_name)

    def unpublish(self, node_name: str) -> None:
        """Delete this node's pool (the driver is going away for good)."""
        self.publish(node_name, [])
