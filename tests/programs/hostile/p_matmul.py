"""Placement: seconds of numpy CPU per call.

expect: timeout
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import LedgerView, PlacementOps, Request


class Hostile(PlacementOps):
    name = "p-matmul"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        x = np.ones((2500, 2500))
        return np.full(len(nodes), float((x @ x @ x @ x @ x @ x).sum()))

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...] | None:
        x = np.ones((2500, 2500))
        return (int((x @ x @ x @ x @ x @ x).sum()) % 1,)
