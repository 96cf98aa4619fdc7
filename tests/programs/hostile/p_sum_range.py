"""Placement: one C call holding the GIL for seconds.

expect: timeout
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import LedgerView, PlacementOps, Request


class Hostile(PlacementOps):
    name = "p-sum-range"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        return np.full(len(nodes), float(sum(range(150_000_000))))

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...] | None:
        return (sum(range(150_000_000)) % 1,)
