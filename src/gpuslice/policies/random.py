"""Random: a uniformly random feasible node and a random GPU that fits.

Optimises: nothing; the floor every other policy must beat.
Source: FGD artifact baseline 01-Random (hkust-adsl/kubernetes-scheduler-simulator): ``RandomScore`` gives one
random feasible node the top score, and ``gpusel=random`` picks a random fitting GPU for a share.
"""

from __future__ import annotations

import numpy as np

from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.base import PlacementOps, TieBreak, lowest_free_gpus
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = ["RandomFit"]


class RandomFit(PlacementOps):
    name = "random"
    summary = "uniformly random feasible node and GPU (FGD paper baseline)"
    memory_in_score = False
    tie_break = TieBreak.RANDOM  # every feasible node scores the same, so this is the whole policy

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
        if req.num_gpu == 0 or req.gpu_milli >= MILLI_PER_GPU:
            return lowest_free_gpus(view, req, node)
        fitting = np.flatnonzero(view.free_gpu_milli[node] >= req.gpu_milli)
        return (int(self.context.rng.choice(fitting)),)
