"""Recursion, which the verifier forbids.

expect: rejected
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-recursion"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (self.order_key(view, job),)
