"""One C call that holds the GIL for seconds: sum over a huge range.

expect: timeout
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-sum-range"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (sum(range(150_000_000)),)
