"""A sort key of five million numbers: an answer too large to take back (a whole queue of such keys also
fills the worker's 512 MiB before its budget runs out, on a fast machine).

expect: invalid or memory or timeout
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-huge-key"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return tuple(range(5_000_000))
