"""Packing: fill partly used GPUs first, then partly used nodes, then idle nodes.

Optimises: keeping whole nodes and GPUs free. Scores, best first:
1. the request fits on already shared GPUs: 100 − (Σ over the GPUs used of free% of each) // 10, at least 50;
2. it must take fully free GPUs of a partly used node: 50 − (fully free GPUs it takes), at least 33;
3. the node is entirely idle: max(33 − free GPUs, free GPUs).
CPU-only requests score 0 everywhere (first feasible node in ledger order).
Source: FGD artifact baseline 04-GpuPacking, gpusel=best (hkust-adsl/kubernetes-scheduler-simulator;
``getPackingScore`` in ``pkg/simulator/plugin/gpu_packing_score.go``, integer arithmetic kept).
"""

from __future__ import annotations

import numpy as np

from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.base import MAX_NODE_SCORE, PlacementOps
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = ["Packing"]


class Packing(PlacementOps):
    name = "packing"
    summary = "shared GPUs, then used nodes, then idle nodes (FGD paper baseline)"
    memory_in_score = False

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        if req.num_gpu == 0:
            return np.zeros(len(nodes))
        free = view.free_gpu_milli[nodes]
        fully_free = (free == MILLI_PER_GPU).sum(axis=1)
        idle_node = fully_free == view.gpu_count[nodes]
        third, half = MAX_NODE_SCORE // 3, MAX_NODE_SCORE // 2
        # The GPUs taken are the request's num_gpu smallest fitting ones; partly used come first.
        partial = (free >= req.gpu_milli) & (free < MILLI_PER_GPU)
        takes_free = np.maximum(req.num_gpu - partial.sum(axis=1), 0)
        # Only a share (num_gpu == 1) can fit on a partly used GPU: the one with the least free.
        smallest_partial = np.where(partial, free, MILLI_PER_GPU).min(axis=1)
        shared_score = np.maximum(MAX_NODE_SCORE - (smallest_partial * 100 // MILLI_PER_GPU) // 10, half)
        score = np.where(
            idle_node,
            np.maximum(third - fully_free, fully_free),
            np.where(takes_free > 0, np.maximum(half - takes_free, third), shared_score),
        )
        return score.astype(np.float64)
