"""Catches BaseException through a tuple, which could swallow the guard's timeout.

expect: rejected
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-catches-timeout"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        try:
            return (sum(range(10)),)
        except (ValueError, BaseException):
            return (0,)
