"""A sort key that is a list, not a tuple.

expect: invalid
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-list-key"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return [1, 2]  # type: ignore[return-value]
