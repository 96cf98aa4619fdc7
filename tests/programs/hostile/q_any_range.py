"""any() over a huge range of zeros... of falsy values, one C call.

expect: timeout
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-any-range"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (any(range(0, 0)) or all(range(1, 400_000_000)),)
