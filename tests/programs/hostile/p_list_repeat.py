"""Placement: list repetition to 1.6 GB.

expect: memory
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import LedgerView, PlacementOps, Request


class Hostile(PlacementOps):
    name = "p-list-repeat"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        return np.full(len(nodes), float(len([0] * 200_000_000)))

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...] | None:
        return (len([0] * 200_000_000) % 1,)
