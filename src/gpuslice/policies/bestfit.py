"""BestFit: put the request on the node it leaves with the least spare capacity.

Optimises: leftover 0.5 · (free CPU − req) / 128 cores + 0.5 · (free GPU − req) / 8 GPUs (lower is better).
Score: int(100 · (1 − leftover)), then min-max normalised over the feasible nodes to 0..100 with integer
division, as the artifact's ``NormalizeScore`` does — which merges near-equal nodes into ties.
Source: FGD artifact baseline 05-BestFit (hkust-adsl/kubernetes-scheduler-simulator; ``getBestFitScore`` in
``pkg/simulator/plugin/best_fit_score.go``).
"""

from __future__ import annotations

import numpy as np

from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.base import MAX_NODE_SCORE, MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI, PlacementOps
from gpuslice.workload.request import Request

__all__ = ["BestFit"]


class BestFit(PlacementOps):
    name = "bestfit"
    summary = "least leftover CPU and GPU after placing (FGD paper baseline)"
    memory_in_score = False

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        cpu_left = (view.free_cpu_milli[nodes] - req.cpu_milli) / MAX_SPEC_CPU_MILLI * 0.5
        gpu_left = (view.free_gpu_milli[nodes].sum(axis=1) - req.total_gpu_milli) / MAX_SPEC_GPU_MILLI * 0.5
        return np.trunc((1.0 - (cpu_left + gpu_left)) * MAX_NODE_SCORE)

    def normalize(self, view: LedgerView, req: Request, scores: np.ndarray) -> np.ndarray:
        low, high = scores.min(), scores.max()
        if high == low:
            return np.zeros_like(scores)
        return (scores - low) * MAX_NODE_SCORE // (high - low)
