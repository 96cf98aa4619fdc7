"""Placement: a score hook that raises.

expect: exception
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import LedgerView, PlacementOps, Request


class Hostile(PlacementOps):
    name = "p-raises"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        raise ValueError("policy bug")

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...] | None:
        raise ValueError("policy bug")
