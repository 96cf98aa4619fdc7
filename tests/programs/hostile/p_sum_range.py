"""Placement: one C call holding the GIL for seconds: about 7 s of CPU here, past two placement budgets
(4 s, where a call is killed) on any machine, so that it is a timeout and never a call that slips under
the budget on a fast or busy one (150 million, about 1.8 s, did under load).

expect: timeout
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import LedgerView, PlacementOps, Request


class Hostile(PlacementOps):
    name = "p-sum-range"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        return np.full(len(nodes), float(sum(range(600_000_000))))

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...] | None:
        return (sum(range(600_000_000)) % 1,)
