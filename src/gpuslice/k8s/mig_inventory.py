"""The MIG profiles this cluster's GPUs offer, for the webhook to admit a MIG pod only when some GPU could
ever run it.

Two sources, read from the API server: the node inventories the device plugin publishes
(``gpuslice.io/node-inventory``: a GPU in MIG mode offers every profile of its model's MIG table) and
the DRA driver's ResourceSlices (each MIG device carries a ``migProfile`` attribute). A GPU whose MIG
mode is off offers none: gpuslice never turns MIG mode on.

Reads are cached for ``ttl_s`` (admission answers within the API server's webhook timeout; a node that
joins is seen within that time). When a read fails, the last good answer stands; with none yet,
``profiles`` raises ``InventoryUnavailable`` and the webhook refuses the pod as retryable (503).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuslice.errors import UserError
from gpuslice.hardware.mig import mig_gpu
from gpuslice.k8s.annotations import ANNOTATION_NODE_INVENTORY, NodeInventory

__all__ = ["DEFAULT_TTL_S", "InventoryUnavailable", "MigInventory", "from_api", "profiles_in"]

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 30.0


class InventoryUnavailable(UserError):
    """The cluster's GPU inventory could not be read and no earlier read is known."""


def profiles_in(nodes: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Every MIG profile some GPU in MIG mode offers, from Node objects and ResourceSlices (API JSON)."""
    found: set[str] = set()
    for node in nodes:
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_NODE_INVENTORY)
        if not text:
            continue
        try:
            inventory = NodeInventory.from_json(text)
        except UserError:
            continue  # a malformed inventory is the extender's to report; it offers nothing here
        for gpu in inventory.gpus:
            if gpu.mig:
                try:
                    found.update(p.name for p in mig_gpu(gpu.model).profiles)
                except UserError:
                    continue  # a model without a MIG table in gpuslice
    for piece in slices:
        for device in (piece.get("spec") or {}).get("devices") or []:
            profile = ((device.get("attributes") or {}).get("migProfile") or {}).get("string")
            if isinstance(profile, str) and profile:
                found.add(profile)
    return frozenset(found)


class MigInventory:
    """``profiles()``: the cluster's MIG profiles, listed at most once per ``ttl_s``; thread-safe."""

    def __init__(
        self,
        list_nodes: Callable[[], list[dict[str, Any]]],
        list_slices: Callable[[], list[dict[str, Any]]],
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._list_nodes = list_nodes
        self._list_slices = list_slices
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._known: frozenset[str] | None = None
        self._read_at = float("-inf")

    def profiles(self) -> frozenset[str]:
        with self._lock:
            if self._clock() - self._read_at >= self._ttl_s:
                try:
                    self._known = profiles_in(self._list_nodes(), self._list_slices())
                except Exception as err:  # an API refusal or outage: the last good read stands
                    if self._known is None:
                        raise InventoryUnavailable(
                            f"cannot read the cluster's GPU inventory: {err}"
                        ) from None
                    log.warning("reading the cluster's GPU inventory failed (%s); using the last read", err)
                self._read_at = self._clock()
            assert self._known is not None
            return self._known


def from_api(client: Any, ttl_s: float = DEFAULT_TTL_S, timeout_s: float = 5.0) -> MigInventory:
    """A ``MigInventory`` over a ``kubernetes`` ApiClient (``kube_client.api_client``). It needs ``list``
    on nodes and, where the DRA API is served, on resourceslices; a cluster without the DRA API has
    no slices. Each list is bounded by ``timeout_s`` so an admission never waits on a stalled read."""
    from gpuslice.k8s.dra.kube import DraApi
    from gpuslice.k8s.kube_client import kubernetes_client_module

    module = kubernetes_client_module()
    core, dra = module.CoreV1Api(client), DraApi(client=client)

    def nodes() -> list[dict[str, Any]]:
        listed = core.list_node(_request_timeout=timeout_s).items
        return list(client.sanitize_for_serialization(listed))

    def slices() -> list[dict[str, Any]]:
        try:
            return dra.list_slices(timeout_s)
        except module.ApiException as err:
            if err.status == 404:  # no resource.k8s.io/v1 on this API server: no DRA pools
                return []
            raise

    return MigInventory(nodes, slices, ttl_s)
