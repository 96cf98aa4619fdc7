"""Deep structure building then deep comparison: a RecursionError in C.

expect: exception
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-deep-recursion-by-nesting"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        key: tuple[Any, ...] = ()
        for _ in range(200_000):
            key = (key,)
        return (len(repr(key)),)
