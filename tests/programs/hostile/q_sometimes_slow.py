"""Slow only for some jobs: every third job costs seconds of CPU.

expect: timeout
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-sometimes-slow"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        if job.seq % 3 == 0:
            return (sum(range(150_000_000)),)
        return (job.seq,)
