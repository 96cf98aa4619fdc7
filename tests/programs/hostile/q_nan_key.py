"""A NaN in the sort key (NaN does not sort).

expect: invalid
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-nan-key"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (float("nan"),)
