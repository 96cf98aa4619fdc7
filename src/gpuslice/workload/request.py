"""What a task asks for: CPU, memory, and one of four GPU shapes.

* CPU-only: ``num_gpu == 0``.
* GPU-sharing: one GPU, ``gpu_milli`` < 1000 of it (milli-GPU: 1000 = one whole GPU's compute and memory).
* Whole GPUs: ``num_gpu == k`` GPUs on one node, each entirely free (``gpu_milli == 1000``).
* A MIG instance: ``mig_profile`` names the profile ("1g.10gb"). Its GPU is one in MIG mode, which a
  home sets aside whole in the ledger's columns (no share or whole-GPU request lands there), so the
  request takes no GPU column: ``num_gpu == 0``; the instance is held as a ``MigHold``
  (``Ledger.reserve_mig``), chosen by the one MIG choice (``scheduler/mig_choice.py``).

``gpu_models`` optionally pins the task to GPU models (openb's ``gpu_spec``, "V100M16|V100M32"); empty
means any model. ``excluded_gpu_models`` rules models out. ``gpu_memory_bytes`` is GPU memory needed on
each GPU used (0: the milli-GPU share alone decides, as in openb).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.node import MAX_GPUS_PER_NODE

__all__ = ["MILLI_PER_GPU", "Request", "RequestKind", "share_milli"]

MILLI_PER_GPU = 1000


def share_milli(compute_percent: int, has_memory: bool) -> int:
    """A slice's compute on each of its GPUs, in milli-GPU, for every home (serve, the webhook and the
    extender, DRA): its compute percent × 10, at least 1; with no percent, a memory-only share reserves 1
    milli (no compute guarantee, but the GPU is marked shared so no whole-GPU job lands on it), and a
    slice with neither takes the whole GPU."""
    if compute_percent:
        return max(1, compute_percent * MILLI_PER_GPU // 100)
    return 1 if has_memory else MILLI_PER_GPU


class RequestKind(enum.Enum):
    CPU_ONLY = "cpu-only"
    SHARING = "gpu-sharing"
    WHOLE = "whole-gpu"
    MIG = "mig-instance"


@dataclass(frozen=True, slots=True)
class Request:
    """One task's demand. Hashable: equal requests share cached placement scores."""

    cpu_milli: int
    memory_bytes: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0  # per GPU, 1..1000; 0 when num_gpu == 0
    gpu_models: tuple[str, ...] = ()  # allowed models, sorted; () = any
    gpu_memory_bytes: int = 0  # per GPU used
    excluded_gpu_models: tuple[str, ...] = ()  # sorted
    mig_profile: str = ""  # a MIG instance of this profile (module docstring); "" = not a MIG request

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_bytes < 0:
            raise InvalidRequest(f"{self}: CPU and memory requests cannot be negative")
        if not 0 <= self.num_gpu <= MAX_GPUS_PER_NODE:
            raise InvalidRequest(f"{self}: num_gpu must be 0..{MAX_GPUS_PER_NODE} (GPUs on one node)")
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise InvalidRequest(f"{self}: gpu_milli is set but num_gpu is 0")
        if self.num_gpu > 0 and not 1 <= self.gpu_milli <= MILLI_PER_GPU:
            raise InvalidRequest(f"{self}: gpu_milli must be 1..{MILLI_PER_GPU} per GPU")
        if self.num_gpu > 1 and self.gpu_milli < MILLI_PER_GPU:
            raise InvalidRequest(
                f"{self}: a share of a GPU (gpu_milli < {MILLI_PER_GPU}) is for one GPU only; "
                "ask for whole GPUs when you need several"
            )
        if self.gpu_memory_bytes < 0:
            raise InvalidRequest(f"{self}: GPU memory cannot be negative")
        if self.gpu_memory_bytes and not self.num_gpu:
            raise InvalidRequest(f"{self}: GPU memory is requested but num_gpu is 0")
        if self.mig_profile and (self.num_gpu or self.mig_profile != self.mig_profile.strip()):
            raise InvalidRequest(
                f"{self}: a MIG instance is asked by its profile alone (num_gpu 0, no blanks around it)"
            )
        for name in ("gpu_models", "excluded_gpu_models"):
            models = getattr(self, name)
            if tuple(sorted(set(models))) != models:
                object.__setattr__(self, name, tuple(sorted(set(models))))
        if set(self.gpu_models) & set(self.excluded_gpu_models):
            both = ", ".join(sorted(set(self.gpu_models) & set(self.excluded_gpu_models)))
            raise InvalidRequest(f"{self}: GPU model(s) {both} both required and excluded")

    @property
    def kind(self) -> RequestKind:
        if self.mig_profile:
            return RequestKind.MIG
        if self.num_gpu == 0:
            return RequestKind.CPU_ONLY
        return RequestKind.SHARING if self.gpu_milli < MILLI_PER_GPU else RequestKind.WHOLE

    def without_memory(self) -> Request:
        """The same request with memory 0: its shape for scores that ignore memory."""
        if self.memory_bytes == 0:
            return self
        return Request(
            self.cpu_milli,
            0,
            self.num_gpu,
            self.gpu_milli,
            self.gpu_models,
            self.gpu_memory_bytes,
            self.excluded_gpu_models,
            self.mig_profile,
        )

    @property
    def total_gpu_milli(self) -> int:
        """All milli-GPU the request takes: 2 whole GPUs = 2000."""
        return self.num_gpu * self.gpu_milli

    def __str__(self) -> str:
        gpu = "no GPU" if self.num_gpu == 0 else f"{self.num_gpu}x{self.gpu_milli}m GPU"
        if self.mig_profile:
            gpu = f"MIG {self.mig_profile}"
        models = f" on {'|'.join(self.gpu_models)}" if self.gpu_models else ""
        if self.excluded_gpu_models:
            models += f" not on {'|'.join(self.excluded_gpu_models)}"
        if self.gpu_memory_bytes:
            gpu += f" with {self.gpu_memory_bytes}B each"
        return f"Request(cpu={self.cpu_milli}m, mem={self.memory_bytes}B, {gpu}{models})"
