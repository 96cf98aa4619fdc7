"""Why a job waits, as a fixed code plus the sentence shown to people.

The code is chosen where the decision is made (the scheduler knows whether it ran out of memory or hit a
quota) and travels typed to the metrics, whose ``reason`` label must be small and stable; the sentence
carries sizes and job ids for people. Nothing turns a sentence back into a code, so rewording a message
never changes a metric or an alert.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["PendingCode", "PendingReason"]


class PendingCode(enum.Enum):
    """The value is the metrics label (``gpuslice_scheduling_failures_total{reason=…}``)."""

    NOT_TRIED = "not_tried"  # submitted since the last scheduling pass: not a failure yet
    UNHEALTHY_GPU = "unhealthy_gpu"
    QUOTA = "quota"
    PREEMPTING = "preempting"
    BEHIND_QUEUE_HEAD = "behind_queue_head"
    NO_MIG_SLOT = "no_mig_slot"
    TOPOLOGY = "topology"
    INSUFFICIENT_GPU_MEMORY = "insufficient_gpu_memory"  # host memory: RefusalCode.INSUFFICIENT_MEMORY
    INSUFFICIENT_COMPUTE = "insufficient_compute"
    INSUFFICIENT_GPUS = "insufficient_gpus"


@dataclass(frozen=True, slots=True)
class PendingReason:
    code: PendingCode
    text: str

    def __str__(self) -> str:
        return self.text

    def then(self, more: str) -> PendingReason:
        """The same code with ``more`` appended to the sentence."""
        return PendingReason(self.code, f"{self.text}; {more}")

    def recoded(self, code: PendingCode) -> PendingReason:
        """The same sentence under another code (a cause found above the one that wrote it)."""
        return PendingReason(code, self.text)
