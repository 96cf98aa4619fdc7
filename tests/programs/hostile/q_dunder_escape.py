"""Climbs from a tuple to every class in the process.

expect: rejected
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-dunder-escape"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (len(().__class__.__bases__[0].__subclasses__()),)
