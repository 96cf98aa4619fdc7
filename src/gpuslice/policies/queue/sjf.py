"""Shortest job first: the job that declares the shortest run time starts first.

Optimises: mean completion time. With true run times it is the classic optimum for jobs that are all
waiting at once (Smith's rule with equal weights); with estimates it is as good as the estimates.
The run time a job declares is its ``max_runtime_seconds`` (``gpuslice submit --max-runtime``; the trace
replay fills it with the recorded duration, or a predicted one). Jobs that declare none go last, in
submission order. Priority is ignored for the order, and so this policy preempts nobody (``may_preempt``
is False): a higher-priority job that evicted a shorter lower-priority one would find it ordered first
again when its grace ends, retaking the room, and the two would trade places for ever.
Where it works well: many short jobs behind a few long ones, with run times known or well predicted.
Weakness: a long job can wait for ever while short ones keep arriving (no aging), and a job that
under-declares its run time jumps the queue.
"""

from __future__ import annotations

import math
from typing import Any

from gpuslice.policies.queue.base import JobRef, QueuedJob, QueueOps, QueueView

__all__ = ["ShortestJobFirst"]


class ShortestJobFirst(QueueOps):
    name = "sjf"
    summary = "shortest declared run time (max runtime) first, then FIFO"
    key_reads_view = False  # the key is the job's own: the order is kept, not re-sorted

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        runtime = job.spec.max_runtime_seconds
        return (runtime if runtime is not None else math.inf,)

    def may_preempt(self, view: QueueView, preemptor: JobRef, victim: JobRef) -> bool:
        return False  # the order ignores priority, so priority preemption would livelock (docstring)
