"""DotProd: Tetris-style alignment of the node's free resources with the request.

Optimises: the dot product of free (CPU, total GPU) and requested (CPU, GPU), each normalised by the
largest node spec (128 cores, 8 GPUs) and halved; a *larger* product gives a *lower* score, so the
policy prefers nodes with less left over in the requested directions.
Score: int(100 · (1 − (cpu_free/128k · cpu_req/128k + gpu_free/8k · gpu_req/8k) / 2)).
Source: FGD artifact baseline 02-DotProd with dimext=merge, norm=max, gpusel=best
(hkust-adsl/kubernetes-scheduler-simulator; ``calculateDotProductScore`` in
``pkg/simulator/plugin/dot_product_score.go``).
"""

from __future__ import annotations

import numpy as np

from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.base import MAX_NODE_SCORE, MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI, PlacementOps
from gpuslice.workload.request import Request

__all__ = ["DotProd"]


class DotProd(PlacementOps):
    name = "dotprod"
    summary = "Tetris dot product of free and requested resources (FGD paper baseline)"
    memory_in_score = False

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        cpu_free = view.free_cpu_milli[nodes] / MAX_SPEC_CPU_MILLI
        gpu_free = view.free_gpu_milli[nodes].sum(axis=1) / MAX_SPEC_GPU_MILLI
        product = cpu_free * (req.cpu_milli / MAX_SPEC_CPU_MILLI) + gpu_free * (
            req.total_gpu_milli / MAX_SPEC_GPU_MILLI
        )
        # same operation order as the artifact so the integer truncation lands on the same side
        return np.trunc(MAX_NODE_SCORE * (1 - product / 2))
