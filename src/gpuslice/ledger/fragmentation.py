"""FGD's fragmentation measure of a node, relative to a target workload (cluster-traces note §1.2).

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
        self.gpu_milli = np.array([s.gpu_milli for s in shapes], dtype=np.int64)
        self.num_gpu = np.array([s.num_gpu for s in shapes], dtype=np.int64)
        self.probability = target.probability
        # access[model, shape]; the extra last row is "CPU-only node", where no GPU shape can run
        access = np.array(
            [[not s.gpu_models or model in s.gpu_models for s in shapes] for model in models]
            + [[False] * len(shapes)],
            dtype=bool,
        )
        self.usable = access & (self.num_gpu > 0)[None, :]  # shapes whose fit can shrink the fragment

    def __call__(self, free_gpu: np.ndarray, free_cpu: np.ndarray, node_model: np.ndarray) -> np.ndarray:
        """F(M) in milli-GPU for each state: free_gpu (..., G), free_cpu (...), node_model (...)."""
        total = free_gpu.sum(axis=-1)
        big_enough = free_gpu[..., None, :] >= self.gpu_milli[:, None]  # (..., M, G)
        fitting_gpus = big_enough.sum(axis=-1)  # (..., M)
        too_small = np.where(big_enough, 0, free_gpu[..., None, :]).sum(axis=-1)  # (..., M)
        can_run = (
            self.usable[node_model]
            & (fitting_gpus >= self.num_gpu)
            & (free_cpu[..., None] >= self.cpu_milli)
        )
        per_shape = np.where(can_run, too_small, total[..., None])
        return per_shape @ self.probability


def node_fragmentation(
    target: TargetWorkload,
    models: Sequence[str],
    free_gpu: np.ndarray,
    free_cpu: np.ndarray,
    node_model: np.ndarray,
) -> np.ndarray:
    """One-off form of ``FragmentationMeasure(target, models)(free_gpu, free_cpu, node_model)``."""
    return FragmentationMeasure(target, models)(free_gpu, free_cpu, node_model)
