"""Reads a file the server can read.

expect: rejected
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-open-file"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (open("/etc/shadow").read(),)
