"""EASY backfill: the blocked head job gets a reservation; a later job may start now only if it cannot
delay that reservation.

The head's reservation (its *shadow*): walk the running jobs by expected end (start + max_runtime; a
job being preempted ends at its preemption time + grace; a job without max_runtime never ends), giving
back what each holds, until the head fits. That moment is the shadow time, and the capacity then is the
shadow capacity.

A later job that fits now may start if either
- it ends (now + its max_runtime) before the shadow time, or
- the head still fits in the shadow capacity with this job also holding its share; the shadow capacity
  then keeps it, so several backfilled jobs cannot together delay the head.
A job without max_runtime never ends, so it backfills only through the second rule ("never backfill
past the reservation"). If the head does not fit even when every running job has ended (memory held
outside gpuslice), nothing gpuslice starts can delay it, and there is no shadow.

Source: Lifka, "The ANL/IBM SP scheduling system" (EASY, 1995); Mu'alem & Feitelson, IEEE TPDS 2001.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

from gpuslice.ledger.placement import Placement

__all__ = ["Shadow", "WhatIf", "allows", "shadow"]


class WhatIf(Protocol):
    """A capacity a what-if changes: serve's machine (``node_fit.MachineWhatIf``) or sim's cluster
    (``queue_adapter.ClusterCapacity``), each changed by the ledger's arithmetic on placements."""

    def copy(self) -> Self: ...
    def give(self, placement: Placement) -> None: ...
    def take(self, placement: Placement) -> None: ...


W = TypeVar("W", bound=WhatIf)


@dataclass(slots=True)
class Shadow(Generic[W]):
    """The head job's reservation: when it can start at the latest, and the capacity left at that time."""

    time: float
    capacity: W


def shadow(
    now_capacity: W,
    running: Sequence[tuple[float, Placement]],
    head_fits: Callable[[W], bool],
) -> Shadow[W] | None:
    """The head's reservation, given the running jobs as (expected end, placement) in a stable order."""
    cap = now_capacity.copy()
    for end, placement in sorted(running, key=lambda r: r[0]):  # sorted() is stable: ties keep start order
        cap.give(placement)
        if head_fits(cap):
            return Shadow(end, cap)
    return None


def allows(
    reservation: Shadow[W] | None,
    placement: Placement,
    end: float,
    head_fits: Callable[[W], bool],
) -> bool:
    """May a job holding ``placement`` until ``end`` start now without delaying the head? Keeps the
    reservation up to date when the answer is yes and the job runs past it."""
    if reservation is None:
        return True
    if math.isfinite(end) and end <= reservation.time:
        return True
    trial = reservation.capacity.copy()
    trial.take(placement)
    if not head_fits(trial):
        return False
    reservation.capacity = trial
    return True
