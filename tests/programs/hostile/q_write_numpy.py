"""Writes a file through numpy.

expect: rejected
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-write-numpy"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        np.save("/tmp/gpuslice-hostile", np.zeros(3))
        return (0,)
