"""Tuned fit: the leftover CPU and GPU BestFit minimises, with its two weights free, plus a bonus for a
GPU share that lands on an already shared GPU. The placement policy ``gpuslice tune`` searches.

Optimises (higher score first):

    score_n = -(CPU_WEIGHT · (free CPU − req) / 128 cores + GPU_WEIGHT · (free GPU − req) / 8 GPUs)
              + SHARE_BONUS · [a share fits on a partly used GPU of n]

The defaults (both weights 0.5, SHARE_BONUS 0) are BestFit's leftover without its integer rounding
and min-max normalisation; a negative weight spreads instead of packing that resource. The GPU choice
inside the node is the mechanism's default (best fit for a share). This module is a policy file but for
its ``__all__`` (it imports only the policy API): ``gpuslice tune`` writes it without that, the constants
set to the best values found, and ``sim``, ``serve --placement`` and the extender load it as any other.
Weakness: the weights are fixed for the whole run; a workload whose mix changes over time needs a new
tune.
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import (
    MAX_SPEC_CPU_MILLI,
    MAX_SPEC_GPU_MILLI,
    MILLI_PER_GPU,
    LedgerView,
    PlacementOps,
    Request,
)

__all__ = ["TunedFit"]  # dropped from the written file (a module dunder, which policy files may not have)

CPU_WEIGHT = 0.5
GPU_WEIGHT = 0.5
SHARE_BONUS = 0.0


class TunedFit(PlacementOps):
    name = "tuned-fit"
    summary = "BestFit's leftover with tuned CPU/GPU weights and a shared-GPU bonus"
    memory_in_score = False

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        cpu_left = (view.free_cpu_milli[nodes] - req.cpu_milli) / MAX_SPEC_CPU_MILLI
        free = view.free_gpu_milli[nodes]
        gpu_left = (free.sum(axis=1) - req.total_gpu_milli) / MAX_SPEC_GPU_MILLI
        score = -(CPU_WEIGHT * cpu_left + GPU_WEIGHT * gpu_left)
        if req.num_gpu == 1 and req.gpu_milli < MILLI_PER_GPU:
            shared = ((free >= req.gpu_milli) & (free < MILLI_PER_GPU)).any(axis=1)
            score = score + SHARE_BONUS * shared
        return score
