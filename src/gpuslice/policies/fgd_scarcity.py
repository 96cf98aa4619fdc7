"""FGD with scarcity prices: grow expected fragmentation least, and spend scarce GPU models last.

Optimises: FGD's gain −Δ (``policies.fgd``) minus a price for the GPU capacity the request consumes,

    gain'_n = −Δ_n − λ · g_r · e_k(n),    score = int(100 · sigmoid(gain'_n / 1000))

with g_r the request's total milli-GPU, k(n) the node's GPU model, λ = ``PRICE_WEIGHT`` and e_k the
*scarcity* of model k in the target workload M: the expected GPU demand of type-constrained shapes
(``gpu_models`` set) that lands on k — each shape's demand spread over its allowed models in proportion
to their capacity — per milli-GPU of k's capacity, divided by the demand of all shapes per milli-GPU of
the cluster. e_k = 0 for a model no constrained shape asks for, ~1 when constrained pods alone would use
k as fully as the average GPU; the score of a node depends only on its own row, so cached scores stay
valid. Quantisation, first-node ties and the GPU choice inside a node are FGD's, unchanged, except
that a CPU-only task breaks FGD's ties by the least free GPU on the node (+0.999 · (1 − free / 8 GPUs)):
its CPU then goes where it can strand the fewest GPUs (FGD's own tie rule takes the first node).

Why: FGD's measure weighs a model by how many shapes *cannot* use it (its free GPUs are a
``no_access`` fragment to them, so consuming them lowers F), never by how much of it the shapes that
can *only* use it will need compared with its size. A small model with heavy pinned demand (gpuspec33:
T4 is 14 % of the GPUs and ~17 % of the GPU demand is T4-only) looks almost like the big G2 pool; the
~100-milli preference FGD has is lost in quantisation and the other Δ terms, flexible pods use up T4,
and T4-only pods fail (12 % unallocated). The price acts like a shadow price on each model's capacity.
Source: FGD (Weng et al., ATC'23) plus the dual-price view of online packing with typed bins
(e.g. Devanur & Hayes, "The adwords problem", EC'09: charge each resource its expected scarcity).
With no constrained shape in M every e_k is 0 and only the CPU-only tie rule differs from FGD.
Known weakness: e_k is fixed from M when the policy is built; it does not fall once a scarce model is
full or rise when the actual arrivals are more constrained than M says, and λ = 0.5 was tuned on the
gpuspec traces with the simulator (λ ∈ {0.25, 0.5, 1, 2}; see benchmarks/out/beat_fgd_log.md). The
CPU-only tie rule is a small gain (~0.1 point on CPU-heavy traces), about noise on the others.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.base import MAX_SPEC_GPU_MILLI, PolicyContext
from gpuslice.policies.fgd import FGD
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

__all__ = ["ScarcityFGD", "model_scarcity"]


class ScarcityFGD(FGD):
    name = "fgd-scarcity"
    summary = "FGD plus a price on GPU models that type-constrained tasks need"
    # milli-GPU of gain given up per milli-GPU consumed at scarcity 1 (tuned: 0.25 · 0.5 · 1 · 2)
    PRICE_WEIGHT: ClassVar[float] = 0.5

    def __init__(self, view: LedgerView, context: PolicyContext) -> None:
        super().__init__(view, context)
        assert context.target is not None  # FGD.__init__ raised otherwise
        # per model index, plus 0 for the "no GPU" index CPU-only nodes carry
        self.scarcity = np.append(model_scarcity(context.target, view), 0.0)
        self._price = np.zeros(0)  # milli-GPU, per node of the _scores call in progress

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        scores = super().score(view, req, nodes)
        if req.num_gpu:
            return scores
        # CPU-only: among FGD's ties (integer scores), the node with the least free GPU, where the CPU
        # taken can strand the fewest GPUs; 0.999 keeps it below one score step
        return scores + 0.999 * (1.0 - view.free_gpu_milli[nodes].sum(axis=1) / MAX_SPEC_GPU_MILLI)

    def _scores(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        # FGD._scores (used by score and pick_gpus) quantises through _gain_score; the price is set
        # here because it needs the nodes, and it is the same for every GPU of a node.
        self._price = self.PRICE_WEIGHT * req.total_gpu_milli * self.scarcity[view.node_model[nodes]]
        return super()._scores(view, req, nodes)

    def _gain_score(self, gain: np.ndarray) -> np.ndarray:
        # gain is (nodes,) or, for a share, (nodes, GPU variants)
        price = self._price[:, None] if gain.ndim == 2 else self._price
        return super()._gain_score(gain - price)


def model_scarcity(target: TargetWorkload, view: LedgerView) -> np.ndarray:
    """e_k for each model in ``view.models``: constrained demand per capacity of k over the cluster's
    demand per capacity (0 when no constrained shape asks for k or the target has no GPU demand)."""
    models = view.models
    capacity = np.array(
        [view.gpu_capacity_milli[view.node_model == k].sum() for k in range(len(models))], dtype=np.float64
    )
    demand = np.zeros(len(models))
    all_demand = 0.0
    for shape, p in zip(target.shapes, target.probability, strict=True):
        gpu = p * shape.total_gpu_milli
        all_demand += gpu
        if not shape.gpu_models or gpu == 0:
            continue
        allowed = capacity * np.array([m in shape.gpu_models for m in models])
        if allowed.sum() > 0:
            demand += gpu * allowed / allowed.sum()
    if all_demand == 0 or capacity.sum() == 0:
        return np.zeros(len(models))
    per_capacity = np.divide(demand, capacity, out=np.zeros(len(models)), where=capacity > 0)
    return per_capacity / (all_demand / capacity.sum())
