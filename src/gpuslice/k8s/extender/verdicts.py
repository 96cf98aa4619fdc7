"""Per node, does a pod fit, and if not why: the verdict codes and texts /filter answers with."""

from __future__ import annotations

import numpy as np

from gpuslice.k8s.annotations import PodGpuRequest
from gpuslice.k8s.extender.cluster import ClusterCache, LedgerBuild, VerdictCache, open_slots
from gpuslice.ledger.fit import code_number
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
    "verdict_texts",
]

VERDICT_SHAPES_MAX = 256  # request shapes whose per-node verdicts are kept (45 kB each at 5,000 nodes)

# Verdict codes of one node for one pod: the ledger's fit-rule numbers (``ledger.fit``; 0 = fits). The
# first two are beyond preemption's reach (they go to FailedAndUnresolvableNodes).
CODE_NO_INVENTORY = code_number(RefusalCode.NO_SUCH_NODE)
CODE_MODEL = code_number(RefusalCode.GPU_MODEL_NOT_ALLOWED)
CODE_SHARES = code_number(RefusalCode.NO_USABLE_GPU)
CODE_GPU = code_number(RefusalCode.INSUFFICIENT_GPU)
CODE_MEMORY = code_number(RefusalCode.INSUFFICIENT_GPU_MEMORY)
CODE_NO_MIG = code_number(RefusalCode.NO_MIG_SLOT)
CODE_RESERVED = code_number(RefusalCode.RESERVED)  # held for a preempting pod
CODE_EXCLUDED = code_number(RefusalCode.EXCLUDED_BY_POLICY)  # refused by the policy's own filter

# The extender's words for the codes whose ledger text says too little to a Kubernetes user.
REASON_NO_INVENTORY = "no gpuslice inventory on this node (is the gpuslice device plugin running?)"
# NO_USABLE_GPU in the extender: ``cluster.open_slots`` left no GPU, for any of its reasons.
REASON_SHARE_LIMIT = (
    "no GPU here can take it: each fitting GPU is in MIG mode, unhealthy, not advertised, or already holds "
    "its maximum number of shares (splitCount)"
)
REASON_NO_MIG_INSTANCE = RefusalCode.NO_MIG_SLOT.value
REASON_RESERVED = RefusalCode.RESERVED.value
REASON_INVALID = "invalid gpuslice request"  # the pod's request itself, before any node is judged


def verdict_texts(ask: PodGpuRequest, models: tuple[str, ...]) -> list[str]:
    """Per verdict code, the FailedScheduling text for ``ask``: the translation of the ledger's codes."""
    texts = [code.value for code in RefusalCode]
    texts.insert(0, "")
    texts[CODE_NO_INVENTORY] = REASON_NO_INVENTORY
    if ask.mig_profile:
        return texts
    req = ask.to_request()
    need = f"need {req.num_gpu} GPU(s) with {req.gpu_milli} milli-GPU" + (
        f" and {ask.memory_mib} MiB free" if ask.memory_mib else ""
    )
    texts[CODE_MODEL] = f"{RefusalCode.GPU_MODEL_NOT_ALLOWED.value}: {_models_text(ask, models)}"
    texts[CODE_SHARES] = f"{REASON_SHARE_LIMIT}; {need}"
    texts[CODE_GPU] = f"{RefusalCode.INSUFFICIENT_GPU.value}: {need}"
    texts[CODE_MEMORY] = f"{RefusalCode.INSUFFICIENT_GPU_MEMORY.value}: {need}"
    return texts


class Verdicts:
    """Per node, whether a pod's request fits, and the reason when it does not (cached per shape, in
    the ledger build of ``cache``)."""

    def __init__(self, cache: ClusterCache) -> None:
        self._cache = cache

    def judge(self, built: LedgerBuild, ask: PodGpuRequest, idx: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Per node a code (the ledger's fit-rule number, 0 = fits) and the texts indexed by code."""
        known = idx >= 0
        safe = np.where(known, idx, 0)
        if ask.mig_profile:
            room = known & (self._cache.mig_fullest(built, ask.mig_profile, safe) >= 0)
            codes = np.select([~known, ~room], [CODE_NO_INVENTORY, CODE_NO_MIG], default=0)
        else:
            req = ask.to_request()
            codes = np.where(known, self.shape_codes(built, req, safe), CODE_NO_INVENTORY)
        return codes, verdict_texts(ask, built.ledger.models)

    def shape_codes(self, built: LedgerBuild, req: Request, nodes: np.ndarray) -> np.ndarray:
        """Verdict codes of ``nodes`` (ledger indices) for ``req``, from the shape's cache: only the rows
        that changed since it was last asked are computed again (at 5,000 nodes one bind changes one)."""
        with self._cache.lock:  # binds change rows under it; the version is read with the rows it describes
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
                cache.codes[stale] = self.row_codes(built, req, stale)
                cache.version[stale] = version[stale]
            return cache.codes[nodes]

    @staticmethod
    def row_codes(built: LedgerBuild, req: Request, rows: np.ndarray) -> np.ndarray:
        """Verdict codes of ledger ``rows``: the ledger's fit rule, the usable GPUs being ``open_slots``."""
        return built.ledger.refusal_codes(
            req, rows, open_slots(built, rows, built.ledger.view.gpu_tasks[rows])
        )


def _models_text(ask: PodGpuRequest, models: tuple[str, ...]) -> str:
    parts = []
    if ask.gpu_models:
        parts.append(f"pod wants {'|'.join(ask.gpu_models)}")
    if ask.excluded_gpu_models:
        parts.append(f"pod excludes {'|'.join(ask.excluded_gpu_models)}")
    return ", ".join(parts) + f" (cluster has {', '.join(models) or 'no GPUs'})"
