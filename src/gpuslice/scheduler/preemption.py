"""Preemption victims: the cheapest set of running jobs whose release lets a blocked job start.

Who may be a victim (the mechanism's rule, no policy can widen it): a running job that is preemptible,
whose own priority is strictly lower than the blocked job's own priority (aging orders the queue but
never makes a job preempt), and that is not already being preempted.

Cost of a set, compared as a tuple, lowest wins (docs/serve-design.md):
1. GPUs it frees, as ``gpus_equivalent`` (whole = 1, shares and MIG instances their fraction);
2. the highest priority in the set, then the sum of priorities (take LOW before NORMAL);
3. GPU-seconds of work lost (run time so far × GPUs): the most recently started go first;
4. the job ids, so equal costs still give one answer.

Search: subsets in increasing size, each costed before it is tried, and tried (a what-if ``fits``) only
if it beats the best so far. The search visits at most ``MAX_SUBSETS`` subsets: an 8-GPU machine with
whole-GPU jobs has at most 255, so the cap only bites with many small shares, where the answer found so
far is kept (an accepted approximation: it can cost a little more than the optimum, never be invalid).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

from gpuslice.scheduler.node_fit import Capacity, Holding, gpus_equivalent

__all__ = ["MAX_SUBSETS", "Victim", "choose_victims", "victim_set_cost"]

MAX_SUBSETS = 2048


@dataclass(frozen=True, slots=True)
class Victim:
    """A running job that may be preempted: what it holds, its priority and when it started."""

    job_id: str
    holding: Holding
    priority: int
    started_at: float


def victim_set_cost(victims: Sequence[Victim], now: float) -> tuple[object, ...]:
    gpus = sum(gpus_equivalent(v.holding) for v in victims)
    lost = sum(max(0.0, now - v.started_at) * gpus_equivalent(v.holding) for v in victims)
    return (
        round(gpus, 9),
        max(v.priority for v in victims),
        sum(v.priority for v in victims),
        round(lost, 6),
        tuple(sorted(v.job_id for v in victims)),
    )


def choose_victims(
    candidates: Sequence[Victim],
    capacity: Capacity,
    fits: Callable[[Capacity], bool],
    now: float,
) -> tuple[Victim, ...] | None:
    """The cheapest subset of ``candidates`` after whose release ``fits`` holds, or None if none does.

    ``capacity`` is not changed; ``fits`` is asked about copies with the subset given back.
    """
    if not candidates:
        return None

    def after_release(subset: Sequence[Victim]) -> bool:
        trial = capacity.copy()
        for v in subset:
            trial.give(v.holding)
        return fits(trial)

    if not after_release(candidates):
        return None  # even all of them together would not make room
    ordered = sorted(candidates, key=lambda v: victim_set_cost((v,), now))
    best: tuple[Victim, ...] = tuple(ordered)
    best_cost = victim_set_cost(best, now)
    visited = 0
    for size in range(1, len(ordered) + 1):
        for subset in combinations(ordered, size):
            visited += 1
            if visited > MAX_SUBSETS:
                return best
            cost = victim_set_cost(subset, now)
            if cost < best_cost and after_release(subset):
                best, best_cost = subset, cost
    return best
