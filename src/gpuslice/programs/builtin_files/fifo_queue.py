"""FIFO queue as a policy file: jobs start in submission order, whatever their priority or tenant.

The built-in ``policies/queue/fifo.py`` rewritten against the policy API: the empty key leaves only the
mechanism's submission sequence.
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Fifo(QueueOps):
    name = "fifo"
    summary = "submission order only"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return ()  # the mechanism appends job.seq: submission order
