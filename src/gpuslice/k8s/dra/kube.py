"""The DRA driver's API server calls: read ResourceClaims, publish this node's ResourceSlices.

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

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSION = "v1"


class DraApi:
    """``get_claim`` (a ``ClaimSource``) and ``publish`` (a node's pool) over one API client."""

    def __init__(self, kubeconfig: str | None = None, *, client: Any | None = None) -> None:
        self._client = client if client is not None else api_client(kubeconfig)
        self._objects = kubernetes_client_module().CustomObjectsApi(self._client)

    def close(self) -> None:
        self._client.close()

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
