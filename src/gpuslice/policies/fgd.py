"""FGD: Fragmentation Gradient Descent — place where the expected fragmentation grows least.

Optimises: Δ = F_n'(M) − F_n(M), the change in node n's fragmentation relative to the target workload M
(``ledger.fragmentation``) if the request were placed there. For a GPU share every fitting GPU is tried
and the one with the smallest Δ is used (first GPU on ties); whole GPUs take the lowest free ones.
Score: int(100 · sigmoid(−Δ / 1000)) with Δ in milli-GPU, as the artifact computes it. The integer
score is deliberate: near-equal Δs tie, ties go to the first node in ledger order, and that implicit
packing is worth ~2 points of unallocated GPUs on openb (research note §1.3: 4.63 % vs 6.99 % with
exact Δ). ``FGDExact`` scores −Δ without quantisation for comparison.
Source: Weng et al., ATC'23; ``calculateGpuShareFragExtendScore`` in the artifact's
``pkg/simulator/plugin/fgd_score.go`` (cluster-traces research note §1.2–1.3).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpuslice.hardware.node import MAX_GPUS_PER_NODE
from gpuslice.ledger.fragmentation import FragmentationMeasure
from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.base import MAX_NODE_SCORE, PlacementOps, PolicyContext, lowest_free_gpus
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = ["FGD", "FGDExact"]

_ONE_GPU_EACH = np.eye(MAX_GPUS_PER_NODE, dtype=np.int64)


class FGD(PlacementOps):
    name = "fgd"
    summary = "least growth of expected fragmentation (FGD, ATC'23)"
    quantized: ClassVar[bool] = True

    def __init__(self, view: LedgerView, context: PolicyContext) -> None:
        super().__init__(view, context)
        if context.target is None:
            raise ValueError("FGD needs a target workload (the trace's task shapes)")
        self.measure = FragmentationMeasure(context.target, view.models)

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        return self._scores_and_gpus(view, req, nodes)[0]

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
        if req.num_gpu == 1 and req.gpu_milli < MILLI_PER_GPU:
            return (int(self._scores_and_gpus(view, req, np.array([node]))[1][0]),)
        return lowest_free_gpus(view, req, node)

    def _gain_score(self, gain: np.ndarray) -> np.ndarray:
        """gain = F before − F after (= −Δ), milli-GPU."""
        if not self.quantized:
            return gain
        # sigmoid first, then ×100, in the artifact's order, so truncation agrees bit for bit
        return np.floor((1.0 / (1.0 + np.exp(-gain / 1000.0))) * MAX_NODE_SCORE)

    def _scores_and_gpus(
        self, view: LedgerView, req: Request, nodes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        free = view.free_gpu_milli[nodes]
        cpu = view.free_cpu_milli[nodes]
        model = view.node_model[nodes]
        before = self.measure(free, cpu, model)
        cpu_after = cpu - req.cpu_milli
        if req.num_gpu == 1 and req.gpu_milli < MILLI_PER_GPU:
            # every "share on GPU g" variant at once: (K, G variants, G GPUs)
            variants = free[:, None, :] - req.gpu_milli * _ONE_GPU_EACH[None, :, :]
            after = self.measure(
                variants,
                np.broadcast_to(cpu_after[:, None], variants.shape[:2]),
                np.broadcast_to(model[:, None], variants.shape[:2]),
            )
            scores = np.where(free >= req.gpu_milli, self._gain_score(before[:, None] - after), -np.inf)
            best_gpu = scores.argmax(axis=1)  # first GPU on ties, like the artifact's strict ">"
            return scores[np.arange(len(nodes)), best_gpu], best_gpu
        after_free = free
        if req.num_gpu:
            # take the num_gpu lowest-indexed GPUs that fit (for whole GPUs: the fully free ones)
            fits = free >= req.gpu_milli
            taken = fits & (np.cumsum(fits, axis=1) <= req.num_gpu)
            after_free = free - req.gpu_milli * taken
        after = self.measure(after_free, cpu_after, model)
        return self._gain_score(before - after), np.zeros(len(nodes), dtype=np.int64)


class FGDExact(FGD):
    name = "fgd-exact"
    summary = "FGD with the exact Δ instead of the artifact's integer score (ablation)"
    quantized = False
