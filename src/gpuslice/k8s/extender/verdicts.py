"""Per node, does a pod fit, and if not why: the verdict codes and texts /filter answers with."""

from __future__ import annotations

import numpy as np

from gpuslice.k8s.annotations import PodGpuRequest
from gpuslice.k8s.extender.cluster import ClusterCache, LedgerBuild, VerdictCache, open_slots
from gpuslice.ledger.placement import RefusalCode
from gpuslice.workload.request import Request

__all__ = [
    "CODE_EXCLUDED",
    "CODE_GPU",
    "CODE_MEMORY",
    "CODE_MODEL",
    "CODE_NO_INVENTORY",
    "CODE_NO_MIG",
    "CODE_RESERVED",
    "CODE_SHARES",
    "REASON_INVALID",
    "REASON_NO_INVENTORY",
    "REASON_NO_MIG_INSTANCE",
    "REASON_RESERVED",
    "REASON_SHARE_LIMIT",
    "Verdicts",
    "fit_codes",
]

VERDICT_SHAPES_MAX = 256  # request shapes whose per-node verdicts are kept (45 kB each at 5,000 nodes)

# Reasons the ledger has no RefusalCode for (fixed text, like RefusalCode values).
REASON_NO_INVENTORY = "no gpuslice inventory on this node (is the gpuslice device plugin running?)"
REASON_SHARE_LIMIT = "every fitting GPU already holds its maximum number of shares (splitCount)"
REASON_NO_MIG_INSTANCE = "no free MIG instance of this profile"
REASON_INVALID = "invalid gpuslice request"
# Verdict codes of one node for one pod (0 = fits); the first two are beyond preemption's reach
# (they go to FailedAndUnresolvableNodes).
CODE_NO_INVENTORY, CODE_MODEL, CODE_SHARES, CODE_GPU, CODE_MEMORY, CODE_NO_MIG = 1, 2, 3, 4, 5, 6
CODE_RESERVED, CODE_EXCLUDED = 7, 8  # held for a preempting pod; refused by the placement policy's own filter
REASON_RESERVED = "held for a higher-priority pod that preempted pods on this node"


class Verdicts(ClusterCache):
    """Per node, whether a pod's request fits, and the reason when it does not (cached per shape)."""

    def _verdicts(
        self, built: LedgerBuild, ask: PodGpuRequest, idx: np.ndarray
    ) -> tuple[np.ndarray, list[str]]:
        """Per node a code, 0 = fits, else an index into the returned reason texts (vectorised)."""
        known = idx >= 0
        safe = np.where(known, idx, 0)
        if ask.mig_profile:
            free = np.array(
                [
                    self._mig_free(built, int(i), ask.mig_profile) if k else 0
                    for i, k in zip(safe.tolist(), known.tolist(), strict=True)
                ]
            )
            codes = np.select([~known, free == 0], [CODE_NO_INVENTORY, CODE_NO_MIG], default=0)
            return codes, ["", REASON_NO_INVENTORY, "", "", "", "", REASON_NO_MIG_INSTANCE]
        req = ask.to_request()
        codes = np.where(known, self._shape_codes(built, req, safe), CODE_NO_INVENTORY)
        n = req.num_gpu
        need = f"need {n} GPU(s) with {req.gpu_milli} milli-GPU" + (
            f" and {ask.memory_mib} MiB free" if ask.memory_mib else ""
        )
        texts = [
            "",
            REASON_NO_INVENTORY,
            f"{RefusalCode.GPU_MODEL_NOT_ALLOWED.value}: {_models_text(ask, built.ledger.models)}",
            f"{REASON_SHARE_LIMIT}; {need}",
            f"{RefusalCode.INSUFFICIENT_GPU.value}: {need}",
            f"{RefusalCode.INSUFFICIENT_GPU_MEMORY.value}: {need}",
        ]
        return codes, texts

    def _shape_codes(self, built: LedgerBuild, req: Request, nodes: np.ndarray) -> np.ndarray:
        """Verdict codes of ``nodes`` (ledger indices) for ``req``, from the shape's cache: only the rows
        that changed since it was last asked are computed again (at 5,000 nodes one bind changes one)."""
        with self._lock:  # binds change rows under it; the version is read with the rows it describes
            cache = built.verdicts.pop(req, None)
            if cache is None:
                count = built.ledger.node_count
                cache = VerdictCache(np.zeros(count, dtype=np.int8), np.full(count, -1, dtype=np.int64))
            built.verdicts[req] = cache  # now the most recently used
            while len(built.verdicts) > VERDICT_SHAPES_MAX:
                del built.verdicts[next(iter(built.verdicts))]
            version = built.ledger.view.version
            stale = np.flatnonzero(cache.version != version)
            if len(stale):
                cache.codes[stale] = self._row_codes(built, req, stale)
                cache.version[stale] = version[stale]
            return cache.codes[nodes]

    @staticmethod
    def _row_codes(built: LedgerBuild, req: Request, rows: np.ndarray) -> np.ndarray:
        """Verdict codes of ledger ``rows`` computed from the ledger (vectorised, the first failing check)."""
        view = built.ledger.view
        return fit_codes(
            req,
            built.ledger.model_allowed(req)[rows],
            open_slots(built, rows, view.gpu_tasks[rows]),
            view.free_gpu_milli[rows],
            view.free_gpu_memory_bytes[rows],
        )


def fit_codes(
    req: Request, model_ok: np.ndarray, slots: np.ndarray, free_milli: np.ndarray, free_memory: np.ndarray
) -> np.ndarray:
    """Verdict codes (0 = fits) of nodes given as (nodes, GPUs) arrays: the first failing check of the
    GPU model, the share slots (``open_slots``), compute, then memory on enough GPUs; the ledger's own
    per-GPU fit (``Ledger.gpu_fits``) plus the share slots. The filter's verdicts read the ledger's rows,
    preemption's what-if a row with its victims given back: one fit rule for both."""
    compute = free_milli >= req.gpu_milli
    memory = free_memory >= req.gpu_memory_bytes
    n = req.num_gpu
    return np.select(
        [
            ~model_ok,
            slots.sum(axis=-1) < n,
            (slots & compute).sum(axis=-1) < n,
            (slots & compute & memory).sum(axis=-1) < n,
        ],
        [CODE_MODEL, CODE_SHARES, CODE_GPU, CODE_MEMORY],
        default=0,
    )


def _models_text(ask: PodGpuRequest, models: tuple[str, ...]) -> str:
    parts = []
    if ask.gpu_models:
        parts.append(f"pod wants {'|'.join(ask.gpu_models)}")
    if ask.excluded_gpu_models:
        parts.append(f"pod excludes {'|'.join(ask.excluded_gpu_models)}")
    return ", ".join(parts) + f" (cluster has {', '.join(models) or 'no GPUs'})"
