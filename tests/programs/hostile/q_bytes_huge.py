"""bytes(n) with n = 2 GB (bytes is not a builtin a policy may name).

expect: rejected
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-bytes-huge"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (len(bytes(2_000_000_000)),)
