"""numpy allocating 2 GB.

expect: memory
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-numpy-ones"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (float(np.ones(250_000_000).sum()),)
