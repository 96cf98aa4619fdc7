"""FIFO: jobs start in the order they were submitted, whatever their priority or tenant.

Optimises: nothing but arrival order, the way task-spooler runs a queue.
Where it works well: one user, or a team that wants "first come, first served" and nothing else.
Weakness: a long queue makes an urgent job wait behind every earlier one, and a tenant that submits
many jobs takes the machine; priorities still choose preemption victims (the mechanism's rule).
"""

from __future__ import annotations

from typing import Any

from gpuslice.policies.queue.base import QueuedJob, QueueOps, QueueView

__all__ = ["Fifo"]


class Fifo(QueueOps):
    name = "fifo"
    summary = "submission order only"
    key_reads_view = False  # the key is the job's own: the order is kept, not re-sorted

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return ()  # the mechanism appends job.seq: submission order
