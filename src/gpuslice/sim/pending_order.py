"""The replay's pending queue in the queue policy's order, kept as jobs come and go where that is exact.

The node scheduler sorts its pending jobs at every step and again after every start
(``order_pending``: the policy's key, then submission order), because a key may read the view: the
time (aging) and the tenants' usage (fair share), which a start changes. A policy whose key reads only
the job (``QueueOps.key_reads_view`` False: FIFO, SJF) gives each waiting job one key for good, so
here such a queue is a sorted container keyed by ``(*order_key, seq)``: a job is placed once when it
enqueues and taken out when it starts, and a step reads the order without sorting. That is the order
``order_pending`` gives, job for job. Any other policy (priority-fair, policy files) is sorted by
``order_pending`` as before, at every step and after every start.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

from sortedcontainers import SortedList

from gpuslice.policies.queue import QueuedJob, QueueOps, QueueView, order_pending

__all__ = ["PendingOrder"]


class _Kept(Sequence[QueuedJob]):
    """A snapshot of the kept order: the sorted keys, each ending with its job (read on demand)."""

    __slots__ = ("_keys",)

    def __init__(self, keys: list[tuple[object, ...]]) -> None:
        self._keys = keys

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if isinstance(i, slice):  # a slice is the jobs of those keys, as a list's slice would be
            return [key[-1] for key in self._keys[i]]
        return self._keys[i][-1]


class PendingOrder:
    """Pending jobs by index; ``ordered(view)`` is ``order_pending``'s order of them."""

    def __init__(self, policy: QueueOps, fallbacks: Counter[str]) -> None:
        self.policy, self.fallbacks = policy, fallbacks
        self.jobs: dict[int, QueuedJob] = {}
        self.kept = not policy.key_reads_view
        self._sorted: SortedList = SortedList()
        self._keys: dict[int, tuple[object, ...]] = {}

    def __len__(self) -> int:
        return len(self.jobs)

    def __bool__(self) -> bool:
        return bool(self.jobs)

    def __iter__(self) -> Iterator[int]:
        return iter(self.jobs)

    def add(self, index: int, job: QueuedJob, view: QueueView) -> None:
        self.jobs[index] = job
        if self.kept:
            key = (*self.policy.order_key(view, job), job.seq, job)  # seq is unique: jobs never compare
            self._keys[index] = key
            self._sorted.add(key)

    def remove(self, index: int) -> None:
        del self.jobs[index]
        if self.kept:
            self._sorted.remove(self._keys.pop(index))

    def ordered(self, view: QueueView) -> Sequence[QueuedJob]:
        """Every pending job in the policy's order at ``view`` (a snapshot: later changes do not show)."""
        if self.kept:
            return _Kept(list(self._sorted))
        return order_pending(self.policy, view, list(self.jobs.values()), self.fallbacks)

    def reordered(self, view: QueueView, order: Sequence[QueuedJob], i: int) -> Sequence[QueuedJob]:
        """``order`` with its tail from ``i`` sorted again after a start changed the view."""
        if self.kept or i >= len(order):
            return order  # no key reads the view: the order stands
        assert isinstance(order, list)
        order[i:] = order_pending(self.policy, view, order[i:], self.fallbacks)
        return order
