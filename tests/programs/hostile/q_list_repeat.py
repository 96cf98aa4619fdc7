"""List repetition to 200 million items (1.6 GB of pointers).

expect: memory
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-list-repeat"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (len([0] * 200_000_000),)
