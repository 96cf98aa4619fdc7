"""The one MIG instance choice, for every home that places MIG requests: serve's node scheduler (it
creates the instance), the Kubernetes extender (it picks one the device plugin advertises) and sim (the
placer's MIG path over the cluster: ``Placer.place`` of a request with a ``mig_profile``).

```text
candidates: per MIG GPU the instances the ledger holds there (``Ledger.mig_layout``), the request's
            profiles best first, and, where instances cannot be created, the existing ones
            (``mig_candidate``, the one builder every home uses; ``created_candidates`` for a cluster
            whose instances are created where chosen)
rank:       the smallest profile first, then the fullest GPU (most slices held), then candidate order
start:      the MIG placement policy's advice on that GPU (``mig_placement.checked_start``: a start that
            is not valid now, or not an existing free instance, falls back to the lowest valid one)
```

Pure and deterministic; a fallback is counted in ``fallbacks["mig-placement: <reason>"]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpuslice.hardware.mig import MigInstance, MigLayout, MigProfile
from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.mig_placement import (
    DEFAULT_MIG_PLACEMENT,
    MigPlacementOps,
    checked_start,
    mig_placement_policy,
)

__all__ = [
    "FullestByNode",
    "MigCandidate",
    "choose_mig_instance",
    "created_candidates",
    "mig_candidate",
    "mig_rank",
]


@dataclass(frozen=True, slots=True)
class MigCandidate:
    """One MIG GPU a request may use. ``layout``: what the policy sees (held instances, and on a static
    GPU the other existing ones, which block their slices); ``held``: slices held by workloads (how full
    the GPU is); ``existing``: per profile name, the starts of existing free instances (None: any
    valid start, the instance is created)."""

    key: Hashable
    layout: MigLayout
    profiles: tuple[MigProfile, ...]
    held: int = 0
    existing: Mapping[str, frozenset[int]] | None = field(default=None, compare=False)

    def starts(self, profile: MigProfile) -> tuple[int, ...]:
        valid = self.layout.placements(profile)
        if self.existing is None:
            return valid
        free = self.existing.get(profile.name, frozenset())
        return tuple(s for s in valid if s in free)


def mig_candidate(
    key: Hashable,
    held: MigLayout,
    profiles: tuple[MigProfile, ...],
    existing: Iterable[MigInstance] | None = None,
) -> MigCandidate:
    """The candidate of one MIG GPU whose held instances are ``held`` (the ledger's layout there, or a
    home's what-if copy of it). ``existing``: the instances that exist on a GPU where they cannot be
    created (Kubernetes: the ones the device plugin advertises); the free ones of other profiles block
    their slices, and only the free ones of ``profiles`` may be chosen. None: any valid start is
    created."""
    if existing is None:
        return MigCandidate(key, held, profiles, held=held.mask)
    taken = {i.start for i in held.instances}
    free = [i for i in existing if i.start not in taken]
    blocking = tuple(i for i in free if i.profile not in profiles)
    starts = {p.name: frozenset(i.start for i in free if i.profile == p) for p in profiles}
    layout = MigLayout(held.gpu, held.instances + blocking)
    return MigCandidate(key, layout, profiles, held.mask, starts)


def created_candidates(view: LedgerView, gpus: Iterable[tuple[int, int]], profile: str) -> list[MigCandidate]:
    """Each of the MIG ``gpus`` ((node, GPU) pairs of the ledger) whose MIG table has ``profile``, as a
    candidate keyed ``(node, gpu)``, its instance created where chosen (sim, like serve's own GPUs). A
    GPU whose table lacks the profile offers none, as in the extender."""
    out = []
    for node, gpu in gpus:
        held = view.mig_layout(node, gpu)
        wanted = None if held is None else held.gpu.named(profile)
        if held is not None and wanted is not None:
            out.append(mig_candidate((node, gpu), held, (wanted,)))
    return out


class FullestByNode:
    """Per MIG profile and ledger node, the rank of the node's best candidate, read as the slices held
    on its fullest GPU with a start for the profile (-1: none), kept at the ledger row's version.

    The one MIG choice takes the fullest GPU over all candidates, the first in order on a tie; a node's
    candidates read only its own row's instances (and, in Kubernetes, its inventory, fixed for a ledger
    build), and every reserve or release bumps that row's ``Ledger.version``. So a home asks only for the
    stale rows' candidates (one after a bind, at any cluster size), and builds the full candidates of
    the first fullest node alone: ``choose_mig_instance`` over them gives what it gives over all."""

    def __init__(self, node_count: int) -> None:
        self._node_count = node_count
        self._held: dict[str, np.ndarray] = {}
        self._version: dict[str, np.ndarray] = {}

    def fullest(
        self,
        profile: str,
        rows: np.ndarray,
        version: np.ndarray,
        candidates_of: Callable[[int], Sequence[MigCandidate]],
    ) -> np.ndarray:
        """Per node of ``rows`` its best candidate's held slices (-1: none); ``version`` the ledger's."""
        held = self._held.get(profile)
        if held is None:
            held = self._held[profile] = np.full(self._node_count, -1, dtype=np.int8)
            self._version[profile] = np.full(self._node_count, -1, dtype=np.int64)
        seen = self._version[profile]
        stale = rows[seen[rows] != version[rows]]
        for node in stale.tolist():
            ranks = [r for c in candidates_of(node) if (r := mig_rank(c)) is not None]
            held[node] = -min(ranks)[1] if ranks else -1  # one profile asked: the rank is (0, -held)
        seen[stale] = version[stale]
        return held[rows]

    @staticmethod
    def first(rows: np.ndarray, held: np.ndarray) -> int | None:
        """The node the one MIG choice takes among ``rows`` (its ``fullest`` answer ``held``): the first
        with the most slices held; None when none has a candidate."""
        if not len(rows) or held.max() < 0:
            return None
        return int(rows[int(np.argmax(held))])


def mig_rank(candidate: MigCandidate) -> tuple[int, int] | None:
    """The candidate's rank (lower is better: profile rank, then minus the slices held); None if no
    profile has a start on it. Homes that score nodes rank them by their best candidate's rank."""
    for rank, profile in enumerate(candidate.profiles):
        if candidate.starts(profile):
            return rank, -candidate.held.bit_count()
    return None


def choose_mig_instance(
    candidates: Sequence[MigCandidate],
    policy: MigPlacementOps | None = None,
    fallbacks: Counter[str] | None = None,
) -> tuple[MigCandidate, MigInstance] | None:
    """The GPU and instance for the request, or None if no candidate has a start; see the module doc."""
    ranked = [(r, pos) for pos, c in enumerate(candidates) if (r := mig_rank(c)) is not None]
    if not ranked:
        return None
    (rank, _), pos = min(ranked)
    candidate = candidates[pos]
    profile = candidate.profiles[rank]
    existing = None
    if candidate.existing is not None:
        existing = candidate.existing.get(profile.name, frozenset())
    policy = policy or mig_placement_policy(DEFAULT_MIG_PLACEMENT)()
    start, why = checked_start(policy, candidate.layout, profile, existing)
    if why is not None and fallbacks is not None:
        fallbacks[f"mig-placement: {why}"] += 1
    if start is None:  # "no start" from a policy: the default's answer, the lowest valid start
        start = candidate.starts(profile)[0]
    return candidate, MigInstance(profile=profile, start=start)
