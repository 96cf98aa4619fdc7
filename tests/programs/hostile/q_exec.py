"""Runs code the verifier has not seen.

expect: rejected
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-exec"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        exec("import os")
        return (0,)
