"""BestFit as a policy file: the built-in ``policies/bestfit.py``, rewritten against the policy API.

Optimises: leftover 0.5 · (free CPU − req) / 128 cores + 0.5 · (free GPU − req) / 8 GPUs (lower is better);
the integer score is min-max normalised to 0..100 with integer division, as the FGD artifact does.
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import (
    MAX_NODE_SCORE,
    MAX_SPEC_CPU_MILLI,
    MAX_SPEC_GPU_MILLI,
    LedgerView,
    PlacementOps,
    Request,
)


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
