"""The one preemption search: which running jobs (or pods) to evict so a blocked one fits.

Every home calls ``find_preemption``: serve's node scheduler (one machine, node 0), the Kubernetes
extender (its own evictions and kube-scheduler's preempt verb) and the DRA driver. The home supplies the
running jobs as ``Victim`` records and a what-if, ``fits_without(node, victims)``; the search never reads
the home's state itself.

Who may be a victim (the mechanism's rule, no policy can widen it): a running job that is preemptible
and whose own priority is strictly lower than the preemptor's own priority (aging orders the queue but
never makes a job preempt). The queue policy's ``may_preempt`` hook may then protect any of them.

Cost of a set, compared as a tuple, lowest wins (docs/serve-design.md):
1. GPUs it frees (whole = 1, shares and MIG instances their GPU-equivalent);
2. the highest priority in the set, then the sum of priorities (take LOW before NORMAL);
3. GPU-seconds of work lost (run time so far × GPUs): the most recently started go first;
4. the job ids, so equal costs still give one answer.
Across nodes the node whose cheapest set costs least wins (then the node's order as given).

Search: per node, subsets in increasing size, each costed before it is tried, and tried (the what-if)
only if it beats the best so far. The search visits at most ``MAX_SUBSETS`` subsets per node: an 8-GPU
machine with whole-GPU jobs has at most 255, so the cap only bites with many small shares, where the
answer found so far is kept (an accepted approximation: it can cost a little more than the optimum,
never be invalid).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from gpuslice.policies.queue.base import JobRef, QueueOps, QueueView, may_preempt

__all__ = ["MAX_SUBSETS", "PreemptionPlan", "Victim", "choose_victims", "find_preemption", "victim_set_cost"]

MAX_SUBSETS = 2048


@dataclass(frozen=True, slots=True)
class Victim:
    """A running job that could be preempted. ``gpus`` is what it frees, its GPU-equivalent
    (``workload/equivalent.py``: whole GPU 1, a share the larger of its compute and memory fractions, a
    MIG instance its slices / 7); ``holding`` is the home's own record of what it holds, handed back to
    ``fits_without`` and never read by the search."""

    job_id: str
    priority: int
    started_at: float
    gpus: float
    node: Hashable = 0
    tenant: str = ""
    preemptible: bool = True
    holding: Any = None

    def ref(self) -> JobRef:
        return JobRef(self.job_id, self.priority, self.tenant, self.started_at)


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """Where the preemptor will fit and whom to evict there."""

    node: Hashable
    victims: tuple[Victim, ...]


def victim_set_cost(victims: Sequence[Victim], now: float) -> tuple[object, ...]:
    gpus = sum(v.gpus for v in victims)
    lost = sum(max(0.0, now - v.started_at) * v.gpus for v in victims)
    return (
        round(gpus, 9),
        max(v.priority for v in victims),
        sum(v.priority for v in victims),
        round(lost, 6),
        tuple(sorted(v.job_id for v in victims)),
    )


def choose_victims(
    candidates: Sequence[Victim],
    fits_without: Callable[[tuple[Victim, ...]], bool],
    now: float,
    below: tuple[object, ...] | None = None,
) -> tuple[Victim, ...] | None:
    """The cheapest subset of ``candidates`` (one node's) whose eviction makes ``fits_without`` hold,
    or None if even all of them would not. With ``below`` (another node's best cost), only a subset
    costing less than it is an answer: None if there is none.

    A subset whose GPU total alone exceeds the best cost so far cannot beat it (the GPUs come first in
    the cost), so it is passed over without building its whole cost, and once the smallest GPU total of
    a size exceeds it the search ends; the answer is the same."""
    if not candidates or not fits_without(tuple(candidates)):
        return None
    ordered = sorted(candidates, key=lambda v: victim_set_cost((v,), now))
    best: tuple[Victim, ...] | None = tuple(ordered)
    best_cost = victim_set_cost(ordered, now)
    if below is not None and not best_cost < below:
        best, best_cost = None, below
    gpus = [v.gpus for v in ordered]
    fewest = sorted(gpus)
    visited = 0
    for size in range(1, len(ordered) + 1):
        if sum(fewest[:size]) > best_cost[0] + 1e-6:  # type: ignore[operator]
            return best  # every subset this large or larger frees more GPUs than the best so far
        for picked in combinations(range(len(ordered)), size):
            visited += 1
            if visited > MAX_SUBSETS:
                return best
            if round(sum(gpus[i] for i in picked), 9) > best_cost[0]:  # type: ignore[operator]
                continue
            subset = tuple(ordered[i] for i in picked)
            cost = victim_set_cost(subset, now)
            if cost < best_cost and fits_without(subset):
                best, best_cost = subset, cost
    return best


def find_preemption(
    preemptor: JobRef,
    running: Sequence[Victim],
    fits_without: Callable[[Hashable, tuple[Victim, ...]], bool],
    now: float,
    *,
    policy: QueueOps | None = None,
    view: QueueView | None = None,
    fallbacks: Counter[str] | None = None,
) -> PreemptionPlan | None:
    """The cheapest way to make room for ``preemptor`` by evicting some of ``running``, or None.

    ``fits_without(node, victims)`` answers whether the preemptor fits on ``node`` once ``victims`` (all
    on that node) are gone; it must only read. ``policy.may_preempt`` (default: the base ``QueueOps``)
    may protect a victim the mechanism's rule allows; its faults fall back to True and are counted in
    ``fallbacks``. ``now`` is on the clock of the victims' ``started_at``.
    """
    policy = policy if policy is not None else QueueOps()
    view = view if view is not None else QueueView(now)
    by_node: dict[Hashable, list[Victim]] = {}
    for v in running:
        if (
            v.preemptible
            and v.priority < preemptor.priority
            and may_preempt(policy, view, preemptor, v.ref(), fallbacks)
        ):
            by_node.setdefault(v.node, []).append(v)
    best: tuple[tuple[object, ...], PreemptionPlan] | None = None
    for node, candidates in by_node.items():
        victims = choose_victims(
            candidates, lambda subset, node=node: fits_without(node, subset), now,
            None if best is None else best[0],
        )  # fmt: skip
        if victims is not None:  # it costs less than the best so far, or it is the first
            best = (victim_set_cost(victims, now), PreemptionPlan(node, victims))
    return None if best is None else best[1]
