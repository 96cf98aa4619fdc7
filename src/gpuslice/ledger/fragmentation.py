"""FGD's fragmentation measure of a node, relative to a target workload (Weng et al., USENIX ATC '23).

For one task shape m and a node n with per-GPU free capacity R_g (milli-GPU):

* m cannot run on n (CPU short, too few GPUs with R_g >= m's per-GPU demand, model not allowed), or
  m needs no GPU: every free milli-GPU on n is a fragment, F_n(m) = Σ_g R_g;
* otherwise only the GPUs too small for m are: F_n(m) = Σ_g R_g · [R_g < d_m].

F_n(M) = Σ_m p_m F_n(m). Memory is not part of the measure, as in the artifact. Everything is evaluated
for a batch of node states at once (B states × M shapes × G GPU slots), so a policy can score every
"what if I put the task here" variant of many nodes in one call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuslice.workload.target import TargetWorkload

__all__ = ["FragmentationMeasure", "node_fragmentation"]


class FragmentationMeasure:
    """A target workload compiled against a ledger's model list, ready to measure node states."""

    def __init__(self, target: TargetWorkload, models: Sequence[str]) -> None:
        shapes = target.shapes
        self.target = target
        self.cpu_milli = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
        self.num_gpu = np.array([s.num_gpu for s in shapes], dtype=np.int64)
        self.probability = target.probability
        # Shapes share few per-GPU demands (12 levels for 30 GPU shapes on openb's default trace), so
        # the per-GPU work is done once per level and indexed per shape.
        gpu_milli = np.array([s.gpu_milli for s in shapes], dtype=np.int64)
        self.levels, self.level_of_shape = np.unique(gpu_milli, return_inverse=True)
        # runnable[model, shape]; the extra last row is "CPU-only node", where no GPU shape can run.
        # CPU-only shapes are never "runnable" here: all free GPU capacity is a fragment to them.
        access = np.array(
            [[not s.gpu_models or model in s.gpu_models for s in shapes] for model in models]
            + [[False] * len(shapes)],
            dtype=bool,
        )
        self.usable = access & (self.num_gpu > 0)[None, :]

    def __call__(self, free_gpu: np.ndarray, free_cpu: np.ndarray, node_model: np.ndarray) -> np.ndarray:
        """F(M) in milli-GPU for each state: free_gpu (..., G), free_cpu (...), node_model (...).

        Written as F = total − Σ_{m runnable} p_m · (free on GPUs big enough for m), which equals
        Σ_m p_m F(m) because the probabilities sum to 1.
        """
        total = free_gpu.sum(axis=-1)
        big_enough = free_gpu[..., None, :] >= self.levels[:, None]  # (..., L, G)
        fitting_gpus = big_enough.sum(axis=-1)[..., self.level_of_shape]  # (..., M)
        usable_milli = (free_gpu[..., None, :] * big_enough).sum(axis=-1)[..., self.level_of_shape]
        runnable = (
            self.usable[node_model] & (fitting_gpus >= self.num_gpu) & (free_cpu[..., None] >= self.cpu_milli)
        )
        # An elementwise product summed per row, not a matrix product: BLAS blocks a product by the
        # batch's size, so one state's F(M) would differ in its last bits with the states measured
        # beside it, and FGD's floored score of a zero gain (-1e-12 → 49, not 50) with it: a decision
        # would depend on which other nodes were scored in the same call.
        return total - (runnable * usable_milli * self.probability).sum(axis=-1)


def node_fragmentation(
    target: TargetWorkload,
    models: Sequence[str],
    free_gpu: np.ndarray,
    free_cpu: np.ndarray,
    node_model: np.ndarray,
) -> np.ndarray:
    """One-off form of ``FragmentationMeasure(target, models)(free_gpu, free_cpu, node_model)``."""
    return FragmentationMeasure(target, models)(free_gpu, free_cpu, node_model)
