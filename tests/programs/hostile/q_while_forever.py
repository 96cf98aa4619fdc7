"""A loop the verifier cannot bound.

expect: rejected
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-while-forever"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        while True:
            pass
