"""max() over a huge range, one C call holding the GIL.

expect: timeout
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-max-range"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (max(range(400_000_000)),)
