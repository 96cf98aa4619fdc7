"""Placement: NaN scores.

expect: invalid
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import LedgerView, PlacementOps, Request


class Hostile(PlacementOps):
    name = "p-nan"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        return np.full(len(nodes), np.nan)

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...] | None:
        return (float("nan"),)  # type: ignore[return-value]
