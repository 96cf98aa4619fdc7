"""Queue policies: in which order pending jobs are tried. One per file, one registry."""

from __future__ import annotations

from gpuslice.policies.queue import base
from gpuslice.policies.queue.base import *  # noqa: F403  # re-exports base.__all__
from gpuslice.policies.queue.base import QueueOps
from gpuslice.policies.queue.fifo import Fifo
from gpuslice.policies.queue.priority_fair import PriorityFair
from gpuslice.policies.queue.sjf import ShortestJobFirst
from gpuslice.registry import Registry

# The ops table and its mechanism functions are re-exported as base.py declares them.
__all__ = [
    "DEFAULT_QUEUE_POLICY", "QUEUE", "Fifo", "PriorityFair", "ShortestJobFirst", "queue_policy",
    *base.__all__,
]  # fmt: skip

QUEUE: Registry[QueueOps] = Registry("queue", (Fifo, PriorityFair, ShortestJobFirst))
# The queue policy of `gpuslice serve` and the node scheduler when none is named.
DEFAULT_QUEUE_POLICY = PriorityFair.name


def queue_policy(name: str) -> type[QueueOps]:
    """The queue policy class registered as ``name``; UnknownPolicy lists the known names otherwise."""
    return QUEUE.lookup(name)
