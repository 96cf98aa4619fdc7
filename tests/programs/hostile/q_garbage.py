"""A sort key that is not a tuple.

expect: invalid
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-garbage"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return "garbage"  # type: ignore[return-value]
