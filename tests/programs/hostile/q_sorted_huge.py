"""sorted() of a huge range: gigabytes of int objects.

expect: memory or timeout
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-sorted-huge"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (len(sorted(range(100_000_000), reverse=True)),)
