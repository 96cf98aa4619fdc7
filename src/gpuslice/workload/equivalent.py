"""The one GPU-equivalent: how many GPUs a slice counts as for quotas, fair share and preemption.

A slice counts what it denies others. A share holds part of one GPU's compute and part of its memory;
whichever part is larger is what no one else can have. A job holding 60 GiB of an 80 GiB GPU leaves
room for 20 GiB beside it, whatever compute it asked for (a memory-only share reserves 1 milli), so it
counts 0.75 GPU, not 0.001; four such jobs on four GPUs count 3, not 0.004.

```text
whole GPUs          k                                       each GPU is wholly taken
a share of one GPU  max(milli / 1000, memory / GPU memory)  the GPU's memory, not the request's
a MIG instance      compute slices / 7                      its GPU is in MIG mode; slices are the unit
```

The memory part depends on the GPU the share sits on: a running share counts against its GPU; a
waiting one has no GPU yet, so its callers say which of the GPUs it may use they mean (``scheduler/
quota.py``: the largest for "could it ever fit", the smallest for "may it preempt").
"""

from __future__ import annotations

from gpuslice.hardware.mig import COMPUTE_SLICES
from gpuslice.workload.request import MILLI_PER_GPU

__all__ = ["gpu_equivalent"]


def gpu_equivalent(
    gpus: int,
    milli: int = MILLI_PER_GPU,
    memory_bytes: int = 0,
    gpu_memory_bytes: int = 0,
    *,
    mig_slices: int = 0,
) -> float:
    """GPUs a slice counts as (module docstring). ``gpus`` GPUs with ``milli`` (1..1000) and
    ``memory_bytes`` on each, on GPUs of ``gpu_memory_bytes``; or, with ``mig_slices``, one MIG instance
    of that many compute slices. ValueError for a share with memory but no GPU size: a caller that
    cannot say which GPU it means must not count the memory as free."""
    if mig_slices:
        return mig_slices / COMPUTE_SLICES
    if gpus <= 0:
        return 0.0
    compute = min(milli, MILLI_PER_GPU) / MILLI_PER_GPU
    if memory_bytes <= 0 or compute >= 1.0:
        return gpus * compute
    if gpu_memory_bytes <= 0:
        raise ValueError(f"a share of {memory_bytes} bytes needs its GPU's memory size to be counted")
    return gpus * max(compute, min(1.0, memory_bytes / gpu_memory_bytes))
