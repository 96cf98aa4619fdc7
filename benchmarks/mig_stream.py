"""Replay a stream of MIG arrivals and departures on one GPU, and the best any placement could do.

What: ``replay`` runs a placement policy over a stream and counts what it accepted; ``optimum`` finds,
by exhaustive search, the most any sequence of placement choices could accept on the same stream.
Why: the MIG benchmark (``benchmarks/mig.py``) and its tests compare policies against each other and
against that optimum on short streams.

Rules shared by both, so the comparison is fair:

- An arrival asks for one of its candidate profiles (smallest first). It is **accepted iff some
  candidate has a valid start at that moment** — no one may turn away a request that fits to keep room
  for a later one. A rejected request is dropped; its later departure does nothing.
- A departure frees the instance of an accepted request.
- ``optimum`` = the maximum, over every choice of (candidate, start) at every accepted arrival, of the
  metric; found by depth-first search with memoisation on (event index, live instances). Each metric
  (accepted before the first rejection, total accepted) is maximised on its own.

Pure and deterministic: no clock, no randomness (streams are built by the caller from a seed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from gpuslice.hardware.mig import MigGpu, MigInstance, MigLayout, MigProfile
from gpuslice.policies.mig_placement import MigPlacementOps

__all__ = ["Arrive", "Depart", "Event", "ReplayResult", "optimum", "replay"]


@dataclass(frozen=True, slots=True)
class Arrive:
    """Request ``request_id`` asks for one of ``candidates`` (best first)."""

    request_id: int
    candidates: tuple[MigProfile, ...]


@dataclass(frozen=True, slots=True)
class Depart:
    """Request ``request_id`` ends; its instance, if it got one, is destroyed."""

    request_id: int


Event = Arrive | Depart


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a stream's replay accepted: before the first rejection, in total, and where each went."""

    accepted_before_first_rejection: int
    accepted: int
    arrivals: int
    starts: dict[int, tuple[str, int] | None]  # request_id -> (profile name, start), None if rejected


def replay(gpu: MigGpu, events: Sequence[Event], policy: MigPlacementOps) -> ReplayResult:
    """Run ``policy`` over ``events`` on an empty ``gpu``; the mechanism validates every choice."""
    layout = MigLayout(gpu)
    live: dict[int, MigInstance] = {}
    starts: dict[int, tuple[str, int] | None] = {}
    accepted, first_rejection, arrivals = 0, None, 0
    for event in events:
        if isinstance(event, Depart):
            inst = live.pop(event.request_id, None)
            if inst is not None:
                layout = layout.without(inst)
            continue
        arrivals += 1
        placed = None
        for profile in event.candidates:
            start = policy.choose(layout, profile)
            if start is not None:
                placed = MigInstance(profile, start)
                break
        if placed is None:
            starts[event.request_id] = None
            if first_rejection is None:
                first_rejection = accepted
            continue
        layout = layout.with_instance(placed)  # raises on an invalid choice: a policy bug, never silent
        live[event.request_id] = placed
        starts[event.request_id] = (placed.profile.name, placed.start)
        accepted += 1
    before = accepted if first_rejection is None else first_rejection
    return ReplayResult(before, accepted, arrivals, starts)


def optimum(gpu: MigGpu, events: Sequence[Event]) -> tuple[int, int]:
    """(max accepted before the first rejection, max total accepted) over all placement choices.

    Exponential in the worst case, but the state is small — at most 7 live instances on 8 slots — and
    memoised, so streams of a few dozen events take milliseconds to a second.
    """
    stream = tuple(events)

    def options(i: int, live: frozenset[tuple[int, MigProfile, int]]) -> list[frozenset]:
        event = stream[i]
        assert isinstance(event, Arrive)
        layout = MigLayout(gpu, tuple(MigInstance(p, s) for _, p, s in live))
        return [live | {(event.request_id, p, s)} for p in event.candidates for s in layout.placements(p)]

    def step_depart(i: int, live: frozenset) -> frozenset:
        rid = stream[i].request_id
        return frozenset(x for x in live if x[0] != rid)

    @cache
    def total(i: int, live: frozenset) -> int:
        if i == len(stream):
            return 0
        if isinstance(stream[i], Depart):
            return total(i + 1, step_depart(i, live))
        nexts = options(i, live)
        if not nexts:
            return total(i + 1, live)
        return 1 + max(total(i + 1, n) for n in nexts)

    @cache
    def before_rejection(i: int, live: frozenset) -> int:
        if i == len(stream):
            return 0
        if isinstance(stream[i], Depart):
            return before_rejection(i + 1, step_depart(i, live))
        nexts = options(i, live)
        if not nexts:
            return 0
        return 1 + max(before_rejection(i + 1, n) for n in nexts)

    return before_rejection(0, frozenset()), total(0, frozenset())
