"""A hook that divides by zero.

expect: exception
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-zero-division"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (1 / (job.seq - job.seq),)
