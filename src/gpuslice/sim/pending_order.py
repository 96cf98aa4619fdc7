"""The replay's pending queue in the queue policy's order, kept as jobs come and go where that is exact.

The node scheduler sorts its pending jobs at every step and again after every start
(``order_pending``: the policy's key, then submission order), because a key may read the view: the
time (aging) and the tenants' usage (fair share), which a start changes. Here a step walks the queue
(``PendingOrder.walk``) and tells the walk after each start (``Walk.started``); the order it gives is
``order_pending``'s at every point, job for job, computed the cheapest exact way the policy allows:

- *kept* (``QueueOps.key_reads_view`` False: FIFO, SJF): each waiting job has one key for good, so
  the queue is a sorted container keyed by ``(*order_key, seq)``; a job is placed once when it
  enqueues, taken out when it starts, and a step reads the order without sorting;
- *merged* (``QueueOps.key_follows_submission``: priority-fair): among the jobs of one tenant and one
  own priority the key never puts a later submission first (aging only raises a level, and the whole
  group shares one usage), so each such group is a FIFO and the order is their merge: at each point
  the next job is the group head with the smallest key at the current view. A start changes the
  view, so the heads' keys are read again, which is what re-sorting the rest would give;
- *sorted* (any other policy, policy files): ``order_pending`` at every step and after every start.

In the merged mode jobs must be added in submission order (``seq`` increasing, ``submitted_at`` never
decreasing), as the replay enqueues them; an add out of order is a ValueError.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from sortedcontainers import SortedList

from gpuslice.policies.queue import QueuedJob, QueueOps, QueueView, order_pending

__all__ = ["PendingOrder", "Walk"]

_Group = tuple[str, int]  # (tenant, own priority)


def declares(policy: QueueOps, flag: str) -> bool:
    """``flag`` as set by the class that defines the policy's key (``order_key`` / ``priority``): a
    subclass that changes the key does not inherit a promise about it."""
    for cls in type(policy).__mro__:
        if "order_key" in cls.__dict__ or "priority" in cls.__dict__:
            return bool(cls.__dict__.get(flag, False))
    return False


class Walk(Iterator[QueuedJob]):
    """One pass over the pending jobs in the policy's order; ``started()`` after each start."""

    def started(self) -> None:
        """A job just started (the view changed): the rest of the walk follows the new view."""

    def after(self, jobs: Iterable[QueuedJob]) -> list[QueuedJob]:
        """``jobs`` (pending, not yet walked) in the order the walk would give them now."""
        raise NotImplementedError


class _ListWalk(Walk):
    """A walk over a list made at its start; re-sorted after a start where keys read the view."""

    def __init__(self, order: list[QueuedJob], resort: PendingOrder | None, view: QueueView) -> None:
        self.order, self.i, self.resort, self.view = order, 0, resort, view

    def __next__(self) -> QueuedJob:
        if self.i >= len(self.order):
            raise StopIteration
        self.i += 1
        return self.order[self.i - 1]

    def started(self) -> None:
        if self.resort is not None and self.i < len(self.order):
            p = self.resort
            self.order[self.i :] = order_pending(p.policy, self.view, self.order[self.i :], p.fallbacks)

    def after(self, jobs: Iterable[QueuedJob]) -> list[QueuedJob]:
        wanted = {j.seq for j in jobs}
        return [j for j in self.order[self.i :] if j.seq in wanted]


class _MergeWalk(Walk):
    """The merge of FIFO groups: the next job is the group head with the smallest key now."""

    def __init__(self, policy: QueueOps, view: QueueView, groups: list[list[QueuedJob]]) -> None:
        self.policy, self.view, self.groups = policy, view, groups
        self.pos = [0] * len(groups)
        self.heads = [self._key(g[0]) for g in groups]

    def _key(self, job: QueuedJob) -> tuple[object, ...]:
        return (*self.policy.order_key(self.view, job), job.seq)

    def __next__(self) -> QueuedJob:
        heads = self.heads
        if not heads:
            raise StopIteration
        g = min(range(len(heads)), key=heads.__getitem__)
        group, p = self.groups[g], self.pos[g]
        job = group[p]
        if p + 1 < len(group):
            self.pos[g] = p + 1
            heads[g] = self._key(group[p + 1])
        else:  # this group is done: drop it
            del self.groups[g], self.pos[g], heads[g]
        return job

    def started(self) -> None:
        self.heads = [self._key(group[p]) for group, p in zip(self.groups, self.pos, strict=True)]

    def after(self, jobs: Iterable[QueuedJob]) -> list[QueuedJob]:
        return sorted(jobs, key=self._key)


class PendingOrder:
    """Pending jobs by index; ``walk(view)`` goes through them in ``order_pending``'s order."""

    def __init__(self, policy: QueueOps, fallbacks: Counter[str]) -> None:
        self.policy, self.fallbacks = policy, fallbacks
        self.jobs: dict[int, QueuedJob] = {}
        self.kept = not policy.key_reads_view
        self.merged = not self.kept and declares(policy, "key_follows_submission")
        self._sorted: SortedList = SortedList()
        self._keys: dict[int, tuple[object, ...]] = {}
        self._groups: dict[_Group, dict[int, QueuedJob]] = {}
        self._last: tuple[int, float] = (-1, float("-inf"))  # the last job added: (seq, submitted_at)

    def __len__(self) -> int:
        return len(self.jobs)

    def __bool__(self) -> bool:
        return bool(self.jobs)

    def __iter__(self) -> Iterator[int]:
        return iter(self.jobs)

    def __contains__(self, index: object) -> bool:
        return index in self.jobs

    def add(self, index: int, job: QueuedJob, view: QueueView) -> None:
        self.jobs[index] = job
        if self.kept:
            key = (*self.policy.order_key(view, job), job.seq, job)  # seq is unique: jobs never compare
            self._keys[index] = key
            self._sorted.add(key)
        elif self.merged:
            if job.seq <= self._last[0] or job.submitted_at < self._last[1]:
                raise ValueError("jobs must be added in submission order (seq and submitted_at increase)")
            self._last = (job.seq, job.submitted_at)
            group = (job.spec.tenant, int(job.spec.priority))
            self._groups.setdefault(group, {})[index] = job

    def remove(self, index: int) -> None:
        job = self.jobs.pop(index)
        if self.kept:
            self._sorted.remove(self._keys.pop(index))
        elif self.merged:
            del self._groups[(job.spec.tenant, int(job.spec.priority))][index]

    def walk(self, view: QueueView) -> Walk:
        """A pass over every pending job in the policy's order at ``view``; the jobs are those pending
        now (jobs added or removed later do not show)."""
        if self.kept:
            return _ListWalk([key[-1] for key in self._sorted], None, view)
        if self.merged:
            return _MergeWalk(self.policy, view, [list(g.values()) for g in self._groups.values() if g])
        order = order_pending(self.policy, view, list(self.jobs.values()), self.fallbacks)
        return _ListWalk(order, self, view)
