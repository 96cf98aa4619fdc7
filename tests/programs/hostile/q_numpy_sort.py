"""numpy sorting a large array, again and again: seconds of CPU.

expect: timeout
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-numpy-sort"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        x = np.arange(20_000_000)[::-1]
        total = 0
        for _ in range(20):
            total += int(np.sort(x)[0])
        return (total,)
