"""str.join over a huge range of numbers turned into strings.

expect: memory or timeout
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-str-join"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (len(",".join(map(str, range(200_000_000)))),)
