"""A numpy array where a tuple is expected.

expect: invalid
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-numpy-key"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return np.zeros(3)  # type: ignore[return-value]
