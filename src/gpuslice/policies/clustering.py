"""Clustering: co-locate tasks with the same kind of GPU request.

Optimises: homogeneity of nodes. Score buckets, best first: a node hosting only this request's kind
(75..100), a node hosting several kinds including this one (50..75), an idle node (25..50), a node
hosting other kinds only (0..25); inside a bucket 25 · (8000 − free GPU milli) // 8000, i.e. fuller
nodes first. Kinds: GPU share, 1 whole GPU, 2, 4, 8 … whole GPUs. CPU-only requests score 0 everywhere,
so they go to the first feasible node in ledger order.
Source: FGD artifact baseline 03-GpuClustering, gpusel=best (hkust-adsl/kubernetes-scheduler-simulator;
``pkg/simulator/plugin/gpu_clustering_score.go``).
"""

from __future__ import annotations

import numpy as np

from gpuslice.hardware.node import MAX_GPUS_PER_NODE
from gpuslice.ledger.ledger import LedgerView
from gpuslice.ledger.placement import Placement
from gpuslice.policies.base import MAX_NODE_SCORE, MAX_SPEC_GPU_MILLI, PlacementOps, PolicyContext
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = ["Clustering"]


def _kind(req: Request) -> int:
    """Column of the request's kind: 0 = GPU share, k = k whole GPUs, -1 = no GPU."""
    if req.num_gpu == 0:
        return -1
    return 0 if req.gpu_milli < MILLI_PER_GPU else req.num_gpu


class Clustering(PlacementOps):
    name = "clustering"
    summary = "keep each node to one kind of GPU request (FGD paper baseline)"
    memory_in_score = False

    def __init__(self, view: LedgerView, context: PolicyContext) -> None:
        super().__init__(view, context)
        # tasks of each kind per node; changes only with the node's own row, so cached scores hold
        self.kinds_on_node = np.zeros((view.node_count, MAX_GPUS_PER_NODE + 1), dtype=np.int64)

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        kind = _kind(req)
        if kind < 0:
            return np.zeros(len(nodes))
        quarter = MAX_NODE_SCORE // 4
        fill = quarter * (MAX_SPEC_GPU_MILLI - view.free_gpu_milli[nodes].sum(axis=1)) // MAX_SPEC_GPU_MILLI
        present = self.kinds_on_node[nodes] > 0
        kinds_present = present.sum(axis=1)
        bucket = np.where(
            present[:, kind],
            np.where(kinds_present == 1, 3, 2),  # only this kind / this kind among others
            np.where(kinds_present == 0, 1, 0),  # idle node / other kinds only
        )
        return (fill + bucket * quarter).astype(np.float64)

    def on_placed(self, view: LedgerView, placement: Placement) -> None:
        kind = _kind(placement.request)
        if kind >= 0:
            self.kinds_on_node[placement.node, kind] += 1

    def on_released(self, view: LedgerView, placement: Placement) -> None:
        kind = _kind(placement.request)
        if kind >= 0:
            self.kinds_on_node[placement.node, kind] -= 1
