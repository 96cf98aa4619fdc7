"""numpy linear algebra that takes seconds of CPU with little memory.

expect: timeout
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-numpy-matmul"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        x = np.ones((2500, 2500))
        return (float((x @ x @ x @ x @ x @ x).sum()),)
