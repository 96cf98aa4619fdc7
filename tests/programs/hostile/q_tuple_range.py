"""tuple() of a huge range: gigabytes.

expect: memory or timeout
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-tuple-range"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (len(tuple(range(300_000_000))),)
