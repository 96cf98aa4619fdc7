"""From bytes per GPU to a slice: the ``--mem`` value to ask for and the catalogue entries that hold it.

The ``--mem`` value is the per-GPU need rounded up to a whole GiB: requests read better that way, and
the round-up (under 1 GiB) is slack, never a shortfall. A GPU model fits when its driver-reported total
(``hardware.gpu_models``) is at least that value; a MIG GPU fits through its smallest profile of at
least that memory (``hardware.mig.smallest_profiles``, HAMi's rule). MIG profiles are offered for
one-GPU slices only: a job spread over several GPUs here asks for whole GPUs or memory shares of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.hardware.gpu_models import GPU_MODELS
from gpuslice.hardware.mig import MIG_GPUS, MigRequestTooLarge, smallest_profiles
from gpuslice.units import GiB

__all__ = ["SliceFit", "fit_slice", "mem_value"]


@dataclass(frozen=True, slots=True)
class SliceFit:
    """The smallest slice for a per-GPU need: ``gpus`` × ``mem`` and where it can go."""

    need_bytes: int  # per GPU, before rounding
    gpus: int
    mem: str  # the --mem value, e.g. "18GiB"
    mem_bytes: int
    gpu_models: tuple[str, ...]  # catalogue names whose memory holds ``mem``, smallest first
    mig_profiles: tuple[str, ...]  # "A100-80GB 3g.40gb": per MIG GPU, the smallest profile that holds it

    def as_dict(self) -> dict[str, object]:
        return {"gpus": self.gpus, "mem": self.mem, "mem_bytes": self.mem_bytes,
                "gpu_models": list(self.gpu_models), "mig_profiles": list(self.mig_profiles)}  # fmt: skip


def mem_value(need_bytes: int) -> tuple[str, int]:
    """``need_bytes`` rounded up to a whole GiB, as the ``--mem`` text and in bytes."""
    gib = max(1, -(-need_bytes // GiB))
    return f"{gib}GiB", gib * GiB


def fit_slice(need_bytes: int, gpus: int = 1) -> SliceFit:
    """The smallest slice of ``gpus`` GPUs with ``need_bytes`` each, and what in the catalogue holds it."""
    mem, mem_bytes = mem_value(need_bytes)
    models = sorted((m for m in GPU_MODELS.values() if m.memory_bytes >= mem_bytes),
                    key=lambda m: (m.memory_bytes, m.name))  # fmt: skip
    mig: list[str] = []
    if gpus == 1:
        for gpu in MIG_GPUS.values():
            try:
                mig.append(f"{gpu.name} {smallest_profiles(gpu, mem_bytes)[0].name}")
            except MigRequestTooLarge:
                continue
    return SliceFit(need_bytes=need_bytes, gpus=gpus, mem=mem, mem_bytes=mem_bytes,
                    gpu_models=tuple(m.name for m in models), mig_profiles=tuple(mig))  # fmt: skip
