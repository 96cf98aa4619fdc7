"""Sleeps in C.

expect: rejected
"""

from __future__ import annotations

import time
from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-import-time-sleep"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        time.sleep(30)
        return (0,)
