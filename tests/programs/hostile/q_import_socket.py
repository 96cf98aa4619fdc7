"""Opens a socket.

expect: rejected
"""

from __future__ import annotations

import socket
from typing import Any

from gpuslice.programs.api import QueuedJob, QueueOps, QueueView


class Hostile(QueueOps):
    name = "q-import-socket"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (socket.gethostname(),)
