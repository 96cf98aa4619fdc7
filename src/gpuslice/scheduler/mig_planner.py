"""MIG planner: from a GPU's current layout and a list of requests to the exact ``nvidia-smi mig`` steps.

For each request, in order (nothing is reordered, so the plan reads like the queue):

```text
candidates = resolve_request(gpu, text)               # "3g.40gb" -> (3g.40gb,); "12GiB" -> smallest first
1. an idle instance of a candidate profile exists     -> reuse it, no command
2. policy.choose(layout, candidate) gives a start      -> create:  nvidia-smi mig -i G -cgi ID:START -C
3. destroying idle instances would make room           -> destroy the fewest (CIs first, then the GI),
                                                          then create as in 2
4. otherwise                                           -> Rejection(code, text), layout unchanged
```

Commands (MIG user guide, "Getting Started", which shows that without a placement the
driver's own choice depends on creation order): ``-cgi ID:START`` creates a GPU instance of profile
``ID`` at memory slice ``START`` (a profile tuple with a placement specifier) and ``-C`` adds its
default compute instance spanning the GI; ``-dci -ci CI -gi GI`` and ``-dgi -gi GI`` destroy them,
compute instances first. ``-i G`` selects the physical GPU. IDs are the ``-lgip`` IDs.

Pure: the plan is data; nothing here runs a command.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

from gpuslice.hardware.mig import MigGpu, MigInstance, MigLayout, format_mask, resolve_request
from gpuslice.ledger.placement import RefusalCode
from gpuslice.policies.mig_placement import MigPlacementOps, checked_start

__all__ = [
    "CreateInstance",
    "DestroyInstance",
    "MigPlan",
    "PlacedRequest",
    "Rejection",
    "plan",
]


@dataclass(frozen=True, slots=True)
class CreateInstance:
    """Create a GPU instance at a pinned start, with its default compute instance."""

    gpu_index: int
    instance: MigInstance

    @property
    def commands(self) -> tuple[str, ...]:
        p = self.instance.profile
        return (f"nvidia-smi mig -i {self.gpu_index} -cgi {p.profile_id}:{self.instance.start} -C",)


@dataclass(frozen=True, slots=True)
class DestroyInstance:
    """Destroy an idle GPU instance: its compute instances first, then the GI."""

    gpu_index: int
    instance: MigInstance

    @property
    def commands(self) -> tuple[str, ...]:
        gi, i = self.instance.gi_id, self.gpu_index
        ci = ",".join(str(c) for c in self.instance.ci_ids)
        return (f"nvidia-smi mig -i {i} -dci -ci {ci} -gi {gi}", f"nvidia-smi mig -i {i} -dgi -gi {gi}")


Step = CreateInstance | DestroyInstance


@dataclass(frozen=True, slots=True)
class PlacedRequest:
    """A request and the instance that serves it; ``reused`` when an idle instance was taken as is."""

    request: str
    instance: MigInstance
    reused: bool = False


@dataclass(frozen=True, slots=True)
class Rejection:
    """A request that cannot be served on this GPU: the refusal code every home uses
    (``RefusalCode.NO_MIG_SLOT``) and a sentence saying why (no free aligned slots, or the profile's
    per-GPU instance cap)."""

    request: str
    code: RefusalCode
    reason: str


@dataclass(frozen=True, slots=True)
class MigPlan:
    """The outcome of ``plan``: placements, rejections, and the steps that turn ``before`` into ``after``."""

    gpu_index: int
    policy: str
    before: MigLayout
    after: MigLayout
    placed: tuple[PlacedRequest, ...]
    rejected: tuple[Rejection, ...]
    steps: tuple[Step, ...]
    fallbacks: dict[str, int] = field(default_factory=dict)  # reason -> times the policy's start was replaced

    @property
    def commands(self) -> tuple[str, ...]:
        return tuple(c for step in self.steps for c in step.commands)


def _reason(layout: MigLayout, request: str, candidates: Sequence) -> Rejection:
    # The cap is the reason only when the slots themselves are free (only the +me profile can hit it).
    capped = [p.name for p in candidates if layout.count(p) >= p.max_count]
    slots_free = any(not layout.mask & p.mask_at(s) for p in candidates for s in p.starts)
    if capped and len(capped) == len(candidates) and slots_free:
        return Rejection(
            request,
            RefusalCode.NO_MIG_SLOT,
            f"{', '.join(capped)}: at most {candidates[0].max_count} per GPU",
        )
    names = ", ".join(f"{p.name} (starts {list(p.starts)})" for p in candidates)
    return Rejection(
        request,
        RefusalCode.NO_MIG_SLOT,
        f"no free aligned slots for {names}; occupied slots {format_mask(layout.mask)} (slot 0 first)",
    )


def _first_start(
    layout: MigLayout, candidates: Sequence, policy: MigPlacementOps, fallbacks: Counter[str]
) -> MigInstance | None:
    """The instance created for the first candidate the policy gives a start for (advice checked)."""
    for profile in candidates:
        start, fell_back = checked_start(policy, layout, profile)
        if fell_back is not None:
            fallbacks[fell_back] += 1
        if start is not None:
            return MigInstance(profile, start)
    return None


def _make_room(
    layout: MigLayout, candidates: Sequence, policy: MigPlacementOps, fallbacks: Counter[str]
) -> tuple[tuple[MigInstance, ...], MigInstance] | None:
    """The fewest idle instances whose removal lets a candidate in, and the instance created then."""
    idle = [i for i in layout.instances if i.idle]
    for k in range(1, len(idle) + 1):
        for victims in combinations(idle, k):
            trial = layout
            for v in victims:
                trial = trial.without(v)
            created = _first_start(trial, candidates, policy, fallbacks)
            if created is not None:
                return victims, created
    return None


def plan(
    gpu: MigGpu,
    requests: Sequence[str],
    policy: MigPlacementOps,
    layout: MigLayout | None = None,
    gpu_index: int = 0,
) -> MigPlan:
    """Plan ``requests`` on GPU ``gpu_index`` whose instances are ``layout`` (empty when None).

    Every request is validated first (UnknownMigProfile, MigRequestTooLarge), so a bad one fails the
    whole call before anything is planned. A start the policy gets wrong (or a policy that raises) is
    replaced by the lowest valid start and counted in ``MigPlan.fallbacks``.
    """
    before = layout if layout is not None else MigLayout(gpu)
    resolved = [(text, resolve_request(gpu, text)) for text in requests]
    current = before
    placed: list[PlacedRequest] = []
    rejected: list[Rejection] = []
    steps: list[Step] = []
    fallbacks: Counter[str] = Counter()
    for text, candidates in resolved:
        # Reuse beats create (no reconfiguration); among idle instances, the best-ranked candidate.
        idle = [i for p in candidates for i in current.instances if i.idle and i.profile == p]
        reusable = idle[0] if idle else None
        if reusable is not None:
            busy = MigInstance(reusable.profile, reusable.start, reusable.gi_id, reusable.ci_ids, idle=False)
            current = current.without(reusable).with_instance(busy)
            placed.append(PlacedRequest(text, busy, reused=True))
            continue
        created = _first_start(current, candidates, policy, fallbacks)
        if created is None:
            room = _make_room(current, candidates, policy, fallbacks)
            if room is None:
                rejected.append(_reason(current, text, candidates))
                continue
            victims, created = room
            for v in victims:
                current = current.without(v)
                steps.append(DestroyInstance(gpu_index, v))
        current = current.with_instance(created)  # valid: checked_start only returns valid starts
        steps.append(CreateInstance(gpu_index, created))
        placed.append(PlacedRequest(text, created))
    return MigPlan(
        gpu_index, policy.name, before, current, tuple(placed), tuple(rejected), tuple(steps), dict(fallbacks)
    )
