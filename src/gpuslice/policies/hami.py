"""HAMi's binpack and spread: node and GPU usage scores from HAMi's scheduler.

Node score: 10 · (used slots / slots + used compute / compute + used memory / memory) over the node's
GPUs, before the request (``pkg/scheduler/policy/node_policy.go``); ``binpack`` takes the highest,
``spread`` the lowest. GPU choice: per fitting GPU 10 · ((1 + used slots) / slots + (req + used compute)
/ compute + (req + used memory) / memory); ``binpack`` tries the highest first, ``spread`` the lowest
(``gpu_policy.go``). A GPU holds at most ``deviceSplitCount`` = 10 tasks (HAMi's default). In openb a
milli-GPU share is both compute and memory, so those two terms are equal here.
Source: Project-HAMi/HAMi ``pkg/scheduler/policy/node_policy.go`` and ``gpu_policy.go``; the
``deviceSplitCount`` default from its ``device-config.yaml`` (docs/references.md, "HAMi").
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.base import PlacementOps
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = ["HamiBinpack", "HamiSpread"]

DEVICE_SPLIT_COUNT = 10  # HAMi deviceSplitCount default: vGPU slots per physical GPU


class _HamiUsage(PlacementOps):
    memory_in_score = False
    direction: ClassVar[float] = 1.0  # +1 binpack (fuller first), −1 spread (emptier first)

    def _open_gpus(self, view: LedgerView, req: Request, nodes: np.ndarray | int) -> np.ndarray:
        return (view.free_gpu_milli[nodes] >= req.gpu_milli) & (view.gpu_tasks[nodes] < DEVICE_SPLIT_COUNT)

    def filter(self, view: LedgerView, req: Request) -> np.ndarray | None:
        if req.num_gpu == 0:
            return None
        return self._open_gpus(view, req, slice(None)).sum(axis=1) >= req.num_gpu

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        gpus = np.maximum(view.gpu_count[nodes], 1)
        used_slots = view.gpu_tasks[nodes].sum(axis=1) / (gpus * DEVICE_SPLIT_COUNT)
        used_share = (view.gpu_capacity_milli[nodes] - view.free_gpu_milli[nodes]).sum(axis=1) / (
            gpus * MILLI_PER_GPU
        )
        return self.direction * 10 * (used_slots + 2 * used_share)

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
        if req.num_gpu == 0:
            return ()
        used = view.gpu_capacity_milli[node] - view.free_gpu_milli[node]
        gpu_score = 10 * (
            (1 + view.gpu_tasks[node]) / DEVICE_SPLIT_COUNT + 2 * (req.gpu_milli + used) / MILLI_PER_GPU
        )
        candidates = np.flatnonzero(self._open_gpus(view, req, node))
        order = np.argsort(-self.direction * gpu_score[candidates], kind="stable")
        return tuple(int(g) for g in candidates[order][: req.num_gpu])


class HamiBinpack(_HamiUsage):
    name = "hami-binpack"
    summary = "HAMi binpack: fullest node and GPU first"
    direction = 1.0


class HamiSpread(_HamiUsage):
    name = "hami-spread"
    summary = "HAMi spread: emptiest node and GPU first"
    direction = -1.0
