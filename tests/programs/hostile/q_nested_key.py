"""A sort key nested deeper than any answer may be.

expect: invalid
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-nested-key"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        key: tuple[Any, ...] = (0,)
        for _ in range(100):
            key = (key,)
        return key
