"""Placement: numpy allocating 2 GB per call.

expect: memory
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import LedgerView, PlacementOps, Request


class Hostile(PlacementOps):
    name = "p-numpy-ones"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        return np.ones(250_000_000)[: len(nodes)]

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...] | None:
        return (int(np.ones(250_000_000)[0]) - 1,)
