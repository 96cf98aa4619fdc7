"""The one fit rule: does a request fit a node's free capacity, and if not, the first check it fails.

Every home asks this rule and only translates its answer (a ``RefusalCode``) into its own words: sim's
"0/N nodes fit" summary (``Ledger.why_not``), serve's pending reason (``scheduler/node_fit.py``), the
extender's FailedScheduling message and filter verdicts (``k8s/extender/verdicts.py``). The rule reads
arrays, so the ledger's own rows and a home's what-if copy of a row (victims given back) are judged
alike.

Checks, in order, per node (``n`` = GPUs asked, each needing ``gpu_milli`` and ``gpu_memory_bytes``):

```text
GPU_MODEL_NOT_ALLOWED     the node's GPU model is not one the request accepts
NO_MIG_SLOT               a MIG request: no MIG GPU of the node has a free start for its profile
NO_USABLE_GPU             fewer than n GPUs the home lets it use (usable mask)
INSUFFICIENT_GPU_MEMORY   fewer than n usable GPUs with the memory free
INSUFFICIENT_GPU          fewer than n usable GPUs with the memory and the compute free
INSUFFICIENT_CPU          not enough free CPU
INSUFFICIENT_MEMORY       not enough free host memory
```

A request with no GPU is judged on CPU and memory only; a MIG request (no GPU column: its GPU is set
aside for instances) on its model, the MIG slot (``mig_slot``, per node, from the ledger's layouts) and
CPU and memory. Codes travel as small integers in arrays
(``code_number``; 0 = fits) and back (``code_of``).

``shortfall`` gives nodes' refusals their amounts (need, free, capacity), as kube-scheduler's ``Fits``
reports each insufficient resource: GPU memory per GPU against the n-th most free usable GPU (what the
best set of n could give each), a share's compute against the most free usable GPU with the memory, whole
GPUs as a count, CPU and host memory as the node's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuslice.ledger.placement import Refusal, RefusalCode, Unit
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = [
    "CHECKS",
    "FITS",
    "UNCURABLE",
    "Rows",
    "code_number",
    "code_of",
    "fit_code",
    "fit_codes",
    "refusal_at",
    "shortfall",
]

FITS = 0
_CODES: tuple[RefusalCode, ...] = tuple(RefusalCode)
_NUMBER = {code: i + 1 for i, code in enumerate(_CODES)}


def code_number(code: RefusalCode) -> int:
    """The code's integer in verdict arrays (1..len(RefusalCode); 0 means it fits)."""
    return _NUMBER[code]


def code_of(number: int) -> RefusalCode | None:
    """The code of a verdict integer; None for 0 (fits)."""
    return _CODES[number - 1] if number else None


# Per verdict integer: does the code say that no eviction can help (``RefusalCode.curable``)? 0 (fits): no.
UNCURABLE = np.array([False, *(not code.curable for code in _CODES)])


# The checks in the order they are made (a node fails at the first; summaries list ties in this order).
CHECKS: tuple[RefusalCode, ...] = (
    RefusalCode.GPU_MODEL_NOT_ALLOWED,
    RefusalCode.NO_MIG_SLOT,
    RefusalCode.NO_USABLE_GPU,
    RefusalCode.INSUFFICIENT_GPU_MEMORY,
    RefusalCode.INSUFFICIENT_GPU,
    RefusalCode.INSUFFICIENT_CPU,
    RefusalCode.INSUFFICIENT_MEMORY,
)
_MODEL, _MIG_SLOT, _USABLE, _GPU_MEMORY, _GPU, _CPU, _MEMORY = (code_number(c) for c in CHECKS)


def fit_codes(
    request: Request,
    model_ok: np.ndarray,
    usable: np.ndarray | None,
    free_gpu_milli: np.ndarray,
    free_gpu_memory: np.ndarray,
    free_cpu: np.ndarray | None = None,
    free_memory: np.ndarray | None = None,
    mig_slot: np.ndarray | None = None,
) -> np.ndarray:
    """Per node the number of the first failing check (``FITS`` = 0 when it fits), vectorised.

    ``model_ok`` (N,), ``usable``/``free_gpu_milli``/``free_gpu_memory`` (N, G); ``usable`` None means
    every GPU slot. ``free_cpu``/``free_memory`` (N,) None skip those checks (homes where CPU and memory
    are someone else's: serve's one machine, kube-scheduler's NodeResourcesFit). ``mig_slot`` (N,): for
    a MIG request, whether a MIG GPU of the node has a free start for its profile."""
    codes = np.zeros(len(model_ok), dtype=np.int8)  # FITS
    # Written from the last check to the first, so that a node's code is the first check it fails.
    if free_memory is not None:
        codes[free_memory < request.memory_bytes] = _MEMORY
    if free_cpu is not None:
        codes[free_cpu < request.cpu_milli] = _CPU
    n = request.num_gpu
    if n:
        memory = free_gpu_memory >= request.gpu_memory_bytes
        both = memory & (free_gpu_milli >= request.gpu_milli)
        if usable is not None:
            memory &= usable
            both &= usable
        codes[both.sum(axis=-1) < n] = _GPU
        codes[memory.sum(axis=-1) < n] = _GPU_MEMORY
        if usable is not None:
            codes[usable.sum(axis=-1) < n] = _USABLE
    if request.mig_profile:
        if mig_slot is None:
            raise ValueError("a MIG request is judged with mig_slot (the node's free MIG starts)")
        codes[~np.asarray(mig_slot, dtype=bool)] = _MIG_SLOT
    if n or request.gpu_models or request.excluded_gpu_models:  # a MIG request only when it names models
        codes[~np.asarray(model_ok, dtype=bool)] = _MODEL
    return codes


def fit_code(
    request: Request,
    model_ok: bool,
    free_gpu_milli: Sequence[int],
    free_gpu_memory: Sequence[int],
    free_cpu: int | None = None,
    free_memory: int | None = None,
    mig_slot: bool | None = None,
    usable: Sequence[bool] | None = None,
) -> int:
    """``fit_codes`` for one node, in plain numbers: for a what-if row judged many times over (the
    replay's preemption search tries thousands of victim sets), where numpy's per-call cost would be
    most of the work. The same checks in the same order; ``tests/ledger/test_fit_rule.py`` keeps the
    two equal on random requests and rows."""
    n = request.num_gpu
    if (n or request.gpu_models or request.excluded_gpu_models) and not model_ok:
        return _MODEL
    if request.mig_profile:
        if mig_slot is None:
            raise ValueError("a MIG request is judged with mig_slot (the node's free MIG starts)")
        if not mig_slot:
            return _MIG_SLOT
    if n:
        if usable is not None and sum(usable) < n:
            return _USABLE
        need_memory, need_milli = request.gpu_memory_bytes, request.gpu_milli
        with_memory = with_both = 0  # usable GPUs with the memory free; of those, with the compute too
        for k, (milli, memory) in enumerate(zip(free_gpu_milli, free_gpu_memory, strict=True)):
            if memory >= need_memory and (usable is None or usable[k]):
                with_memory += 1
                with_both += milli >= need_milli
        if with_memory < n:
            return _GPU_MEMORY
        if with_both < n:
            return _GPU
    if free_cpu is not None and free_cpu < request.cpu_milli:
        return _CPU
    if free_memory is not None and free_memory < request.memory_bytes:
        return _MEMORY
    return FITS


@dataclass(frozen=True, slots=True)
class Rows:
    """Nodes' capacity as the fit rule reads it, one row per node: per GPU slot (N, G) the free milli-GPU,
    the free and total memory (0 on a slot with no GPU) and whether the home lets the request use it (a
    bool array); per node (N,) the free and total CPU and memory (zeros where the home does not judge
    them)."""

    free_gpu_milli: np.ndarray
    free_gpu_memory: np.ndarray
    gpu_memory: np.ndarray
    usable: np.ndarray
    free_cpu: np.ndarray
    cpu: np.ndarray
    free_memory: np.ndarray
    memory: np.ndarray


def shortfall(code: RefusalCode, request: Request, rows: Rows) -> tuple[float, np.ndarray, np.ndarray, Unit]:
    """(need, free per row, capacity per row, unit) of the resource ``code`` names, for ``request`` on
    ``rows``; zeros and ``Unit.NONE`` for a code that names none (a model, a MIG slot)."""
    n, use = request.num_gpu, rows.usable
    zeros = np.zeros(len(use), dtype=np.int64)
    if code is RefusalCode.NO_USABLE_GPU:
        return n, use.sum(axis=-1), (rows.gpu_memory > 0).sum(axis=-1), Unit.GPUS
    if code is RefusalCode.INSUFFICIENT_GPU_MEMORY:  # the n-th most free usable GPU: the best set's least
        free = np.sort(np.where(use, rows.free_gpu_memory, 0))[:, -n] if n else zeros  # each row sorted
        return request.gpu_memory_bytes, free, np.where(use, rows.gpu_memory, 0).max(axis=-1), Unit.GPU_MEMORY
    if code is RefusalCode.INSUFFICIENT_GPU:
        memory = use & (rows.free_gpu_memory >= request.gpu_memory_bytes)
        if request.gpu_milli < MILLI_PER_GPU:  # a share (always of one GPU): its compute
            most = np.where(memory, rows.free_gpu_milli, 0).max(axis=-1)
            return request.gpu_milli, most, np.full(len(use), MILLI_PER_GPU), Unit.GPU_MILLI
        both = memory & (rows.free_gpu_milli >= request.gpu_milli)
        return n, both.sum(axis=-1), use.sum(axis=-1), Unit.GPUS
    if code is RefusalCode.INSUFFICIENT_CPU:
        return request.cpu_milli, rows.free_cpu, rows.cpu, Unit.CPU_MILLI
    if code is RefusalCode.INSUFFICIENT_MEMORY:
        return request.memory_bytes, rows.free_memory, rows.memory, Unit.MEMORY
    return 0, zeros, zeros, Unit.NONE


def refusal_at(
    code: RefusalCode, request: Request, rows: Rows, nodes: Sequence[int], k: int | None = None
) -> Refusal:
    """The refusal of row ``k`` of ``rows`` (node ``nodes[k]``) with its amounts (``shortfall``); with
    ``k`` None, of the row with the most of that resource free (the first on a tie)."""
    need, free, capacity, unit = shortfall(code, request, rows)
    k = int(np.argmax(free)) if k is None else k
    return Refusal(code, int(nodes[k]), need=need, free=int(free[k]), capacity=int(capacity[k]), unit=unit)
