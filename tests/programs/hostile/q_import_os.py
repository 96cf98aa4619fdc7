"""Imports os to fork, kill and read files.

expect: rejected
"""

from __future__ import annotations

import os
from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-import-os"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (os.getpid(),)
