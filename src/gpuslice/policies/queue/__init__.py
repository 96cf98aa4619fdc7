"""Queue policies: in which order pending jobs are tried. One per file, one registry."""

from __future__ import annotations

from gpuslice.policies.queue.base import QueuedJob, QueueOps, QueueView, effective_priority, order_pending
from gpuslice.policies.queue.fifo import Fifo
from gpuslice.policies.queue.priority_fair import PriorityFair
from gpuslice.policies.queue.sjf import ShortestJobFirst
from gpuslice.registry import Registry

__all__ = [
    "DEFAULT_QUEUE_POLICY",
    "QUEUE",
    "Fifo",
    "PriorityFair",
    "QueueOps",
    "QueueView",
    "QueuedJob",
    "ShortestJobFirst",
    "effective_priority",
    "order_pending",
    "queue_policy",
]

QUEUE: Registry[QueueOps] = Registry("queue", (Fifo, PriorityFair, ShortestJobFirst))
# The queue policy of `gpuslice serve` and the node scheduler when none is named.
DEFAULT_QUEUE_POLICY = PriorityFair.name


def queue_policy(name: str) -> type[QueueOps]:
    """The queue policy class registered as ``name``; UnknownPolicy lists the known names otherwise."""
    return QUEUE.lookup(name)
