"""FGD as a policy file: the built-in ``policies/fgd.py`` rewritten against the policy API.

Fragmentation Gradient Descent (Weng et al., ATC'23): place where the expected fragmentation of the node,
relative to the target workload, grows least. Score int(100 · sigmoid(−Δ / 1000)), Δ in milli-GPU; a
share tries every fitting GPU and keeps the best (first on ties). The caches are instance attributes set
up in ``__init__`` (derived from the view, rebuilt on a swap), so they are not maps.
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import (
    MAX_GPUS_PER_NODE,
    MAX_NODE_SCORE,
    MILLI_PER_GPU,
    FragmentationMeasure,
    LedgerView,
    PlacementOps,
    PolicyContext,
    Request,
    lowest_free_gpus,
)


def is_share(req: Request) -> bool:
    return req.num_gpu == 1 and req.gpu_milli < MILLI_PER_GPU


class FGD(PlacementOps):
    name = "fgd"
    summary = "least growth of expected fragmentation (FGD, ATC'23)"
    memory_in_score = False

    def __init__(self, view: LedgerView, context: PolicyContext) -> None:
        super().__init__(view, context)
        if context.target is None:
            raise ValueError("FGD needs a target workload (the trace's task shapes)")
        self.measure = FragmentationMeasure(context.target, view.models)
        self.one_gpu_each = np.eye(MAX_GPUS_PER_NODE, dtype=np.int64)
        self.frag = np.zeros(view.node_count)  # F_n(M) per node, valid while the node's version matches
        self.frag_version = np.full(view.node_count, -1, dtype=np.int64)
        self.best_gpu = {}  # share shape -> (best GPU per node, node version it was scored at)

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        return self.scores(view, req, nodes)

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
        if not is_share(req):
            return lowest_free_gpus(view, req, node)
        shape = req.without_memory()
        memo = self.best_gpu.get(shape)
        if view is not self.view or memo is None or memo[1][node] != view.version[node]:
            self.scores(view, shape, np.array([node]))
            memo = self.best_gpu[shape]
        return (int(memo[0][node]),)

    def gain_score(self, gain: np.ndarray) -> np.ndarray:
        """gain = F before − F after (= −Δ), milli-GPU; sigmoid, then ×100, in the artifact's order."""
        return np.floor((1.0 / (1.0 + np.exp(-gain / 1000.0))) * MAX_NODE_SCORE)

    def scores(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        free = view.free_gpu_milli[nodes]
        cpu_after = view.free_cpu_milli[nodes] - req.cpu_milli
        model = view.node_model[nodes]
        if is_share(req):
            # every "share on GPU g" variant at once: (K, G variants, G GPUs)
            after_free = free[:, None, :] - req.gpu_milli * self.one_gpu_each[None, :, :]
            cpu_after = np.repeat(cpu_after, MAX_GPUS_PER_NODE)
            model_after = np.repeat(model, MAX_GPUS_PER_NODE)
            after_free = after_free.reshape(-1, MAX_GPUS_PER_NODE)
        else:
            after_free, model_after = free, model
            if req.num_gpu:
                fits = free >= req.gpu_milli
                after_free = free - req.gpu_milli * (fits & (np.cumsum(fits, axis=1) <= req.num_gpu))
        own_view = view is self.view
        stale = nodes[self.frag_version[nodes] != view.version[nodes]] if own_view else nodes
        measured = self.measure(
            np.concatenate([view.free_gpu_milli[stale], after_free]),
            np.concatenate([view.free_cpu_milli[stale], cpu_after]),
            np.concatenate([view.node_model[stale], model_after]),
        )
        if own_view:
            self.frag[stale] = measured[: len(stale)]
            self.frag_version[stale] = view.version[stale]
            before = self.frag[nodes]
        else:
            before = measured[: len(stale)]
        after = measured[len(stale) :]
        if not is_share(req):
            return self.gain_score(before - after)
        after = after.reshape(len(nodes), MAX_GPUS_PER_NODE)
        scores = np.where(free >= req.gpu_milli, self.gain_score(before[:, None] - after), -np.inf)
        best_gpu = scores.argmax(axis=1)  # first GPU on ties, like the artifact's strict ">"
        if not own_view:
            return scores[np.arange(len(nodes)), best_gpu]
        shape = req.without_memory()
        memo = self.best_gpu.get(shape)
        if memo is None:
            memo = (np.zeros(view.node_count, dtype=np.int64), np.full(view.node_count, -1, dtype=np.int64))
            self.best_gpu[shape] = memo
        memo[0][nodes] = best_gpu
        memo[1][nodes] = view.version[nodes]
        return scores[np.arange(len(nodes)), best_gpu]
