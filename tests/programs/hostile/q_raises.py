"""A hook that raises.

expect: exception
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-raises"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        raise ValueError("policy bug")
