"""Placement: scores that are a string.

expect: invalid
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import LedgerView, PlacementOps, Request


class Hostile(PlacementOps):
    name = "p-garbage"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        return "garbage"  # type: ignore[return-value]

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...] | None:
        return "garbage"  # type: ignore[return-value]
