"""The placement ops table: what a placement policy may override, and what it gets if it does not.

Lifecycle of one request (the mechanism is ``scheduler.placer.Placer``):

```text
feasible = ledger.fits(req) & policy.filter(view, req)        # a policy can narrow, never widen
scores   = policy.score(view, req, nodes)                      # only for feasible nodes whose row changed
scores   = policy.normalize(view, req, scores)                 # over all feasible nodes at once
node     = best score; ties by policy.tie_break                # FIRST: lowest index in ledger order
gpus     = policy.pick_gpus(view, req, node)                   # advice, or None for the default; the
                                                               # ledger validates it
ledger.reserve(node, gpus, req) -> Placement                   # refused advice -> default gpus, counted
policy.on_placed(view, placement)   ...   policy.on_released(view, placement)
```

Scores are cached per request shape: a reservation changes one node's row (its ``version`` goes up), so
every other node's score for that shape stays valid. That holds when a node's score depends only on its
own row and on policy state that changes only with that row (``on_placed`` / ``on_released``), which is
the case for every policy here; ``normalize`` exists for scores that also depend on the other nodes.

Ties are part of a policy, not an accident of iteration: ``tie_break = TieBreak.FIRST`` gives the node
that comes first in the ledger's order. The openb replay shuffles that order by seed, which reproduces
the FGD artifact exactly (its kube-scheduler picks the lexicographically smallest name among the best,
and names carry a seeded random prefix: the artifact's vendored generic_scheduler.go and simulator.go;
see docs/references.md, "openb replay and the FGD baselines").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gpuslice.ledger.ledger import LedgerView
from gpuslice.ledger.placement import Placement
from gpuslice.workload.request import MILLI_PER_GPU, Request
from gpuslice.workload.target import TargetWorkload

__all__ = ["PlacementOps", "PolicyContext", "TieBreak", "best_fit_gpus", "lowest_free_gpus"]

# Normalisers of the artifact's vector scores: the largest node it models, 128 cores and 8 GPUs
# (MaxSpecCpu = 128000, MaxSpecGpu = 8000 in pkg/type/open-gpu-share/utils/const.go).
MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000
MAX_NODE_SCORE = 100  # kube-scheduler's framework.MaxNodeScore


class TieBreak(enum.Enum):
    """How the mechanism chooses among nodes with the best score."""

    FIRST = "first"  # the first in ledger order (seeded node order in the openb replay)
    RANDOM = "random"  # uniformly at random, from the policy context's generator


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may know when it is built: its randomness and the expected workload."""

    rng: np.random.Generator
    target: TargetWorkload | None = None


class PlacementOps:
    """Base of every placement policy. Only ``name`` is required; each hook has a working default."""

    name: ClassVar[str] = "default"
    summary: ClassVar[str] = "first feasible node, best-fit GPU"
    tie_break: ClassVar[TieBreak] = TieBreak.FIRST
    # False when score() never reads the request's memory: requests that differ only in memory then
    # share cached scores (memory still decides feasibility through the ledger's fit mask).
    memory_in_score: ClassVar[bool] = True

    def __init__(self, view: LedgerView, context: PolicyContext) -> None:
        self.view = view
        self.context = context

    def filter(self, view: LedgerView, req: Request) -> np.ndarray | None:
        """Extra per-node mask ANDed with the ledger's own fit mask; None (default) adds nothing."""
        return None

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        """Scores for ``nodes`` (indices of feasible nodes), higher is better. Default: all equal."""
        return np.zeros(len(nodes))

    def normalize(self, view: LedgerView, req: Request, scores: np.ndarray) -> np.ndarray:
        """Rescale the scores of all feasible nodes together. Default: unchanged."""
        return scores

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...] | None:
        """GPUs to use on the chosen node, or None (the default) for the mechanism's own rule,
        ``scheduler.placer.default_gpus``: best fit for a share, the best-connected set for whole GPUs."""
        return None

    def on_placed(self, view: LedgerView, placement: Placement) -> None:
        """Called after a reservation succeeded. Default: nothing."""

    def on_released(self, view: LedgerView, placement: Placement) -> None:
        """Called after a placement was released. Default: nothing."""


def lowest_free_gpus(view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
    """The ``num_gpu`` lowest-indexed GPUs with room for the request (``AllocateExclusiveGpuId``)."""
    fitting = np.flatnonzero(view.gpu_fits(req, node))
    return tuple(int(g) for g in fitting[: req.num_gpu])


def best_fit_gpus(
    view: LedgerView, req: Request, node: int, usable: np.ndarray | None = None
) -> tuple[int, ...]:
    """The one best-fit rule, for every home: for a share, the fitting GPU with the least free memory when
    the request names memory, else the least free milli-GPU (then least free milli, lowest index: the
    FGD artifact's ``best`` choice when memory is not asked); for whole GPUs, the lowest-indexed free
    ones. ``usable`` (bool per GPU slot) narrows the GPUs that may be chosen. () if nothing fits."""
    if req.num_gpu == 0:
        return ()
    fitting = view.gpu_fits(req, node)
    if usable is not None:
        fitting = fitting & usable
    candidates = np.flatnonzero(fitting)
    if len(candidates) < req.num_gpu:
        return ()
    if req.gpu_milli >= MILLI_PER_GPU:
        return tuple(int(g) for g in candidates[: req.num_gpu])
    milli = view.free_gpu_milli[node][candidates]
    first = view.free_gpu_memory_bytes[node][candidates] if req.gpu_memory_bytes else milli
    # lexsort: last key first; candidates are ascending, so equal keys keep the lowest index
    return (int(candidates[np.lexsort((candidates, milli, first))[0]]),)
