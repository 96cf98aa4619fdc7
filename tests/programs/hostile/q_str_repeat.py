"""String repetition to 2 GB.

expect: memory
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-str-repeat"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (len("x" * 2_000_000_000),)
