"""The DRA allocator's metrics (``gpuslice k8s dra-allocator --metrics-port``): its ResourceSlice pools in
the cluster families of ``observe/cluster_metrics.py`` (a pool is one node, named after it), its gated
pods left unplaced as pending pods by reason code, and the pods it preempted.

At each scrape the pools are read afresh from the API (ResourceSlices and ResourceClaims, two list
calls) into an ``Inventory``, the same ledger a pass of the allocator builds, so a scrape shows the
pools as they are even while no gated pod makes the allocator look. If the API does not answer, the
scrape has no pool series (a warning is logged) and still has the pending and preemption series.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from gpuslice.hardware.node import MAX_GPUS_PER_NODE
from gpuslice.k8s.dra.allocator import AllocatorApi, DraAllocator, Inventory
from gpuslice.observe.cluster_metrics import (
    WHOLE_GPU_TARGET,
    ClusterCollector,
    ClusterFigures,
    ledger_figures,
    pending_by_reason,
)
from gpuslice.workload.target import TargetWorkload

__all__ = ["DraMetrics", "pool_figures"]

log = logging.getLogger(__name__)

_NO_POOLS = np.zeros(0, dtype=np.int64)


def pool_figures(inventory: Inventory, allocator: DraAllocator, now: float | None = None) -> ClusterFigures:
    """The figures of ``inventory``'s pools, with ``allocator``'s pending pods and preemptions. FGD's
    target is the allocator's (``--target-workload``), else the shapes of the allocated claims, as a
    pass's policy gets it; with no claim yet, one whole GPU."""
    now = time.time() if now is None else now
    pending = pending_by_reason(dict(allocator.pending).values(), now)
    if inventory.ledger is None:
        return ClusterFigures([], [], *([_NO_POOLS] * 6), pending=pending, preemptions=allocator.preemptions)
    target = allocator.target or (
        TargetWorkload.from_requests(inventory.shapes) if inventory.shapes else WHOLE_GPU_TARGET
    )
    ledger = inventory.ledger
    present = np.arange(MAX_GPUS_PER_NODE)[None, :] < ledger.view.gpu_count[:, None]
    models = [str((gpus[0].attributes.get("productName") or {}).get("string", "")) for gpus in inventory.gpus]
    figures, _ = ledger_figures(
        ledger,
        len(inventory.nodes),
        models,
        ledger.live_placements,
        present,
        target,
        pending=pending,
        preemptions=allocator.preemptions,
    )
    return figures


class DraMetrics:
    """The allocator's registry: ``ClusterCollector`` over ``pool_figures`` of the pools read at scrape."""

    def __init__(self, api: AllocatorApi, allocator: DraAllocator) -> None:
        self._api = api
        self._allocator = allocator
        self.registry = CollectorRegistry()
        self.registry.register(ClusterCollector(self.figures))

    def figures(self) -> ClusterFigures:
        try:
            inventory = Inventory(self._api.list_slices(), self._api.list_claims(), self._allocator.policy)
        except Exception as err:  # the API server away or refusing: no pool series this scrape
            log.warning("metrics: cannot read the DRA pools: %s", err)
            inventory = Inventory([], [], self._allocator.policy)
        return pool_figures(inventory, self._allocator)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
