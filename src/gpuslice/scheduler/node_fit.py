"""What a job needs on one machine, whether it fits a capacity snapshot, which GPUs it gets, and why not.

The node scheduler asks three questions of a ``Demand`` against a ``MachineWhatIf``: the ledger's row of
the machine (``Ledger.row``: free compute and memory per GPU, MIG slot layouts), as it is or with
placements given back or held in a what-if (backfill, preemption):

```text
demand_for(spec, machine)        -> Demand, or InvalidRequest when the job can never run here (at submit)
refusal_code(demand, capacity)   -> RefusalCode or None: the ledger's fit rule (``ledger.fit``) on the
                                    machine's row, the job's eligible GPUs usable; then the topology need
refusal(demand, capacity)        -> the same as a ``Refusal`` with its amounts (``ledger.fit.refusal_at``)
fits(demand, capacity)           -> bool, ``refusal_code is None`` (what-ifs call it often)
choose_mig(demand, capacity)     -> Choice (GPU, MIG slot) or None
why_not(demand, capacity)        -> PendingReason: the refusal and a sentence in serve's words, e.g.
                                    INSUFFICIENT_GPU_MEMORY, "needs 40 GiB on one GPU; largest free is
                                    22 GiB on GPU 3"
```

Each job's ledger request is built once, at submit (``Demand.request``), and is what the fit rule judges,
the placer chooses GPUs for and the start reserves (``Holding.request``).

GPU choice inside the machine is not made here: shares and whole GPUs are chosen by the shared placer
(``Placer.pick_gpus``: the placement policy's advice, else best fit for a share and ``pick_gpu_set`` for
whole GPUs), as in sim and the Kubernetes extender; a MIG instance by the one MIG choice
(``scheduler/mig_choice.py``), as in the extender: the smallest candidate profile first, then the
fullest MIG GPU, at the start the MIG placement policy advises (validated with ``MigLayout.can_place``).

Pure and deterministic: every loop runs in GPU index order.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from gpuslice.errors import InvalidRequest, UserError
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import MigInstance, MigProfile, format_mask, mig_gpu, resolve_request
from gpuslice.hardware.topology import Topology
from gpuslice.ledger.fit import FITS, Rows, code_of, fit_code, refusal_at
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.mig import MigHold, mig_request
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode
from gpuslice.ledger.whatif import NodeRow
from gpuslice.policies.gpuset.pick import meets_need
from gpuslice.policies.mig_placement import MigPlacementOps
from gpuslice.scheduler.mig_choice import MigCandidate, choose_mig_instance, mig_candidate, mig_rank
from gpuslice.scheduler.node_decisions import MigAssignment
from gpuslice.scheduler.reasons import PendingReason
from gpuslice.units import format_size
from gpuslice.workload.equivalent import gpu_equivalent
from gpuslice.workload.job import JobSpec, TopologyNeed
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = [
    "Choice",
    "Demand",
    "DemandKind",
    "Holding",
    "MachineWhatIf",
    "adopted_holding",
    "choose_mig",
    "demand_for",
    "fits",
    "gpus_equivalent",
    "mig_candidates",
    "mig_request",
    "refusal",
    "refusal_code",
    "why_not",
]


class DemandKind(enum.Enum):
    NONE = "none"  # no GPU at all
    WHOLE = "whole"  # k whole GPUs
    SHARE = "share"  # part of one GPU: compute milli and/or memory
    MIG = "mig"  # one MIG instance


@dataclass(frozen=True, slots=True)
class Demand:
    """A job's need resolved against the machine. ``eligible``: the GPUs it may use (model, MIG mode).

    ``mig_options`` holds, per eligible MIG GPU, the profiles that satisfy the request, best first.
    Hashable, so jobs of the same shape share fit results inside one scheduling pass.
    """

    kind: DemandKind
    count: int = 0
    milli: int = 0  # per GPU
    memory_bytes: int = 0  # per GPU, shares only
    eligible: tuple[int, ...] = ()
    need: TopologyNeed = TopologyNeed.ANY
    mig_options: tuple[tuple[int, tuple[MigProfile, ...]], ...] = ()
    mig_text: str = ""
    # The ledger request of a share or whole-GPU job, built once at submit: the fit rule judges it and
    # the start reserves exactly it (a MIG job's is built when its instance is chosen: ``mig_request``).
    request: Request = field(default_factory=lambda: Request(cpu_milli=0))


@dataclass(frozen=True, slots=True)
class Holding:
    """What a running job takes: ``milli`` and ``memory_bytes`` on each of ``gpus``, or one MIG instance.

    ``request`` is the ledger entry a start reserves (the demand's, or the MIG instance's)."""

    gpus: tuple[int, ...]
    milli: int = 0
    memory_bytes: int = 0
    mig: MigInstance | None = None
    request: Request | None = field(default=None, compare=False)

    @property
    def placement(self) -> Placement:
        """The ledger placement a start reserves for it (``Ledger.reserve`` / ``reserve_mig`` on node 0),
        before it is reserved: what a what-if takes or gives."""
        if self.request is None:
            raise ValueError("a holding without its ledger request has no placement")
        if self.mig is None:
            return Placement(0, self.gpus, self.request)
        return Placement(
            0, self.gpus if self.request.num_gpu else (), self.request, mig=MigHold(self.gpus[0], self.mig)
        )


@dataclass(frozen=True, slots=True)
class Choice:
    """Where a job would go: its GPUs and, for MIG, the instance to create."""

    gpus: tuple[int, ...]
    holding: Holding


class MachineWhatIf:
    """The machine's free capacity as the node scheduler judges a job against it: the ledger's row
    (``Ledger.row``, a value: the ledger owns every number in it), and in a what-if (backfill, preemption)
    that row with placements given back or held, by the ledger's own arithmetic (``NodeRow.given`` /
    ``taken``). ``external`` is memory held outside gpuslice per GPU, for reasons only (it is already
    subtracted, through a pseudo-placement in the ledger)."""

    __slots__ = ("external", "row")

    def __init__(self, row: NodeRow, external: Sequence[int] = ()) -> None:
        self.row = row
        self.external = tuple(external) or (0,) * len(row.gpu_milli)

    def copy(self) -> MachineWhatIf:
        return MachineWhatIf(self.row, self.external)

    def give(self, placement: Placement) -> None:
        self.row = self.row.given((placement,))

    def take(self, placement: Placement) -> None:
        self.row = self.row.taken((placement,))


def gpus_equivalent(h: Holding, gpu_memory_bytes: int) -> float:
    """GPUs a holding counts as for quotas, fair share and preemption (``workload.equivalent``: whole = 1
    each, a share max(compute, memory) fraction of its GPU, which has ``gpu_memory_bytes``, a MIG
    instance its compute slices / 7)."""
    if h.mig is not None:
        return gpu_equivalent(1, mig_slices=h.mig.profile.compute_slices)
    return gpu_equivalent(len(h.gpus), h.milli, h.memory_bytes, gpu_memory_bytes)


def adopted_holding(
    job_id: str,
    demand: Demand,
    gpus: tuple[int, ...],
    mig: MigAssignment | None,
    ledger: Ledger,
    machine: Machine,
) -> Holding:
    """What a job found running after a restart holds on ``gpus`` (and ``mig``): InvalidRequest when it
    conflicts with what ``ledger`` has recorded already (what is recorded wins) or with the machine."""
    n = machine.gpu_count
    bad = [g for g in gpus if not 0 <= g < n]
    if bad:
        raise InvalidRequest(f"gpus: GPU {bad[0]} does not exist (this machine has 0–{n - 1})")
    if demand.kind is DemandKind.MIG:
        layout = None if mig is None or gpus != (mig.gpu,) else ledger.mig_layout(0, mig.gpu)
        if mig is None or layout is None:
            raise InvalidRequest(f"mig: job {job_id} is a MIG job; give its MIG GPU, profile and start")
        try:
            profile = layout.gpu.profile(mig.profile)
        except UserError as err:
            raise InvalidRequest(f"mig: {err}") from None
        request = mig_request(profile, machine.gpus[mig.gpu].memory_bytes)
        instance = MigInstance(profile, mig.start)
        if ledger.check_mig(0, mig.gpu, instance, request) is not None:
            raise InvalidRequest(
                f"mig: {profile.name}@{mig.start} does not fit GPU {mig.gpu} "
                f"(slots {format_mask(layout.mask)})"
            )
        return Holding(gpus, mig=instance, request=request)
    if len(gpus) != max(demand.count, 0) or set(gpus) - set(demand.eligible):
        raise InvalidRequest(
            f"gpus: job {job_id} needs {demand.count} of GPU {list(demand.eligible)}, got {list(gpus)}"
        )
    refused = ledger.check(0, gpus, demand.request)
    if refused is not None:  # the ledger's own fit rule
        raise InvalidRequest(f"gpus: cannot adopt job {job_id} on GPU {list(gpus)}: {refused}")
    return Holding(gpus, demand.milli, demand.memory_bytes, request=demand.request)


# ---- submit-time resolution -------------------------------------------------------------------------


def _models_allowed(spec: JobSpec, model: str) -> bool:
    return (not spec.gpu_models or model in spec.gpu_models) and model not in spec.excluded_gpu_models


def demand_for(spec: JobSpec, machine: Machine) -> Demand:
    """The job's need on ``machine``; InvalidRequest naming the field when it can never run here."""
    if spec.gpus == 0:
        return Demand(DemandKind.NONE)  # its request: no GPU, no CPU (the default)
    models = machine.models
    allowed_models = [m for m in models if _models_allowed(spec, m)]
    if not allowed_models:
        if spec.gpu_models:
            raise InvalidRequest(
                f"gpu_models: no GPU model in {{{', '.join(spec.gpu_models)}}} on this machine "
                f"(it has {', '.join(models)})"
            )
        raise InvalidRequest(
            f"excluded_gpu_models: every GPU model on this machine ({', '.join(models)}) is excluded"
        )
    if spec.mig_profile:
        return _mig_demand(spec, machine)
    eligible = tuple(g.index for g in machine.gpus if not g.mig_enabled and _models_allowed(spec, g.model))
    if not eligible:
        raise InvalidRequest(
            "gpus: every GPU this job may use is in MIG mode; ask for a MIG profile (mig_profile) instead"
        )
    if spec.gpus > len(eligible):
        raise InvalidRequest(
            f"gpus: the job needs {spec.gpus} GPUs but this machine has {len(eligible)} it may use "
            f"(GPU {', '.join(map(str, eligible))})"
        )
    largest = max(eligible, key=lambda g: (machine.gpus[g].memory_bytes, -g))
    if spec.gpu_memory_bytes > machine.gpus[largest].memory_bytes:
        raise InvalidRequest(
            f"gpu_memory_bytes: {format_size(spec.gpu_memory_bytes)} per GPU is more than any GPU it may "
            f"use has (largest: {format_size(machine.gpus[largest].memory_bytes)} on GPU {largest})"
        )
    if spec.topology is not TopologyNeed.ANY:
        if machine.topology is None:
            raise InvalidRequest(
                f"topology: this machine's GPU wiring is unknown, so {spec.topology.value} cannot be "
                "guaranteed; drop the topology need"
            )
        if not any(meets_need(machine.topology, c, spec.topology) for c in combinations(eligible, spec.gpus)):
            raise InvalidRequest(
                f"topology: no {spec.gpus} GPUs of this machine are all {_need_text(spec.topology)}"
            )
    asked = spec.request()
    if spec.is_share:
        request = Request(
            cpu_milli=0, num_gpu=1, gpu_milli=asked.gpu_milli, gpu_memory_bytes=asked.gpu_memory_bytes
        )
        return Demand(
            DemandKind.SHARE,
            count=1,
            milli=request.gpu_milli,
            memory_bytes=request.gpu_memory_bytes,
            eligible=eligible,
            request=request,
        )
    request = Request(cpu_milli=0, num_gpu=spec.gpus, gpu_milli=MILLI_PER_GPU)
    return Demand(
        DemandKind.WHOLE,
        count=spec.gpus,
        milli=MILLI_PER_GPU,
        eligible=eligible,
        need=spec.topology,
        request=request,
    )


def _mig_demand(spec: JobSpec, machine: Machine) -> Demand:
    mig_gpus = [g for g in machine.gpus if g.mig_enabled and _models_allowed(spec, g.model)]
    if not mig_gpus:
        raise InvalidRequest(
            "mig_profile: no GPU this job may use has MIG mode enabled; ask for memory or whole GPUs"
        )
    options: list[tuple[int, tuple[MigProfile, ...]]] = []
    errors: list[str] = []
    for g in mig_gpus:
        try:
            options.append((g.index, resolve_request(mig_gpu(g.mig_model), spec.mig_profile)))
        except UserError as err:
            errors.append(str(err))
    if not options:
        raise InvalidRequest(f"mig_profile: {errors[0]}")
    return Demand(
        DemandKind.MIG,
        count=1,
        eligible=tuple(g for g, _ in options),
        mig_options=tuple(options),
        mig_text=spec.mig_profile,
    )


def _need_text(need: TopologyNeed) -> str:
    return "joined by NVLink" if need is TopologyNeed.NVLINK else "behind one PCIe switch or NVLink"


# ---- fit, choice, reasons ---------------------------------------------------------------------------


def _whole_free(demand: Demand, cap: MachineWhatIf) -> list[int]:
    return [g for g in demand.eligible if cap.row.gpu_milli[g] >= MILLI_PER_GPU]


def _usable(demand: Demand, gpus: int) -> tuple[bool, ...]:
    eligible = set(demand.eligible)
    return tuple(g in eligible for g in range(gpus))


def mig_candidates(demand: Demand, cap: MachineWhatIf) -> list[MigCandidate]:
    """The job's MIG GPUs on ``cap`` as candidates of the one MIG choice (instances are created here);
    ``cap``'s layouts are the ledger's (``Ledger.mig_layout``) or a what-if copy of them."""
    return [
        mig_candidate(g, layout, profiles)
        for g, profiles in demand.mig_options
        if (layout := cap.row.layouts.get(g)) is not None
    ]


def refusal_code(demand: Demand, cap: MachineWhatIf, topology: Topology | None) -> RefusalCode | None:
    """Why the job cannot start on ``cap`` now, in the ledger's vocabulary, or None if it can: the
    ledger's fit rule (``ledger.fit``) over this machine's row, the job's eligible GPUs as the usable
    ones; then, as only serve knows the wiring and the MIG layouts here, a GPU set meeting the topology
    need (``NO_GPU_SET``) or a free MIG start (``NO_MIG_SLOT``). (For shares and whole GPUs the placer
    then always finds GPUs: its default takes any fitting GPU, and any set that meets the need.)"""
    if demand.kind is DemandKind.NONE:
        return None
    if demand.kind is DemandKind.MIG:
        fits_one = any(mig_rank(c) is not None for c in mig_candidates(demand, cap))
        return None if fits_one else RefusalCode.NO_MIG_SLOT
    row = cap.row  # CPU and host memory are not serve's to judge: left out
    number = fit_code(
        demand.request, True, row.gpu_milli, row.gpu_memory_bytes, usable=_usable(demand, len(row.gpu_milli))
    )
    if number != FITS:
        return code_of(number)
    if demand.kind is DemandKind.SHARE or demand.need is TopologyNeed.ANY:
        return None
    free = _whole_free(demand, cap)
    if any(meets_need(topology, c, demand.need) for c in combinations(free, demand.count)):
        return None
    return RefusalCode.NO_GPU_SET


def refusal(demand: Demand, cap: MachineWhatIf, topology: Topology | None) -> Refusal | None:
    """``refusal_code`` as the one refusal record, with the amounts of the resource its code names (on
    node 0, serve's one machine), or None if the job can start on ``cap`` now."""
    code = refusal_code(demand, cap, topology)
    if code is None:
        return None
    zero, row = np.zeros(1, dtype=np.int64), cap.row  # CPU and host memory are not serve's to judge
    rows = Rows(
        np.array([row.gpu_milli]),
        np.array([row.gpu_memory_bytes]),
        np.array([row.gpu_memory_capacity_bytes]),
        np.array([_usable(demand, len(row.gpu_milli))]),
        zero, zero, zero, zero,
    )  # fmt: skip
    return refusal_at(code, demand.request, rows, (0,), 0)


def fits(demand: Demand, cap: MachineWhatIf, topology: Topology | None) -> bool:
    """Could the job start on ``cap`` now? ``refusal_code(...) is None``."""
    return refusal_code(demand, cap, topology) is None


def choose_mig(
    demand: Demand,
    cap: MachineWhatIf,
    policy: MigPlacementOps | None = None,
    fallbacks: Counter[str] | None = None,
) -> Choice | None:
    """The MIG GPU and slot the job gets on ``cap``, or None if none is free: the one MIG choice
    (``scheduler/mig_choice.py``: smallest profile, fullest GPU, the MIG placement policy's start
    through the family's advice check; a fallback counted in ``fallbacks["mig-placement: <reason>"]``)."""
    chosen = choose_mig_instance(mig_candidates(demand, cap), policy, fallbacks)
    if chosen is None:
        return None
    candidate, instance = chosen
    g = int(candidate.key)  # type: ignore[call-overload]
    request = mig_request(instance.profile, cap.row.gpu_memory_capacity_bytes[g])
    return Choice((g,), Holding((g,), mig=instance, request=request))


def _gpu_list(gpus: Sequence[int]) -> str:
    if not gpus:
        return "none"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(map(str, gpus))


def _percent(milli: int) -> str:
    return f"{milli / 10:g} %"


def why_not(demand: Demand, cap: MachineWhatIf, topology: Topology | None) -> PendingReason:
    """Why the job does not fit ``cap`` now: the fit rule's refusal (``refusal``, with its amounts) and a
    sentence with sizes and GPU numbers (call only when it does not fit)."""
    record = refusal(demand, cap, topology) or Refusal(RefusalCode.INSUFFICIENT_GPU, 0)
    code = record.code
    if code is RefusalCode.NO_MIG_SLOT:
        slots = "; ".join(
            f"GPU {g} slots {format_mask(cap.row.layouts[g].mask)}" for g, _ in demand.mig_options
        )
        return PendingReason(
            record, f"needs MIG {demand.mig_text}; no MIG GPU has a free slot for it ({slots})"
        )
    if demand.kind is DemandKind.SHARE:
        return PendingReason(record, _share_text(demand, cap, code))
    free = _whole_free(demand, cap)
    k = demand.count
    if code is RefusalCode.NO_GPU_SET:  # enough GPUs, none of the sets meets the topology need
        return PendingReason(
            record,
            f"needs {k} GPUs all {_need_text(demand.need)}; "
            f"the free ones ({_gpu_list(free)}) hold no such set",
        )
    noun = "whole GPU" if k == 1 else "whole GPUs"
    text = f"needs {k} {noun}; {len(free)} {'is' if len(free) == 1 else 'are'} free"
    if free:
        text += f" ({_gpu_list(free)})"
    outside = [g for g in demand.eligible if cap.external[g] and g not in free]
    if outside:
        held = ", ".join(f"GPU {g} has {format_size(cap.external[g])}" for g in outside)
        text += f"; used outside gpuslice: {held}"
    return PendingReason(record, text)


def _share_text(demand: Demand, cap: MachineWhatIf, code: RefusalCode) -> str:
    eligible = demand.eligible
    free_memory, free_milli = cap.row.gpu_memory_bytes, cap.row.gpu_milli
    best_mem = max(eligible, key=lambda g: (free_memory[g], -g))
    best_milli = max(eligible, key=lambda g: (free_milli[g], -g))
    if code is RefusalCode.INSUFFICIENT_GPU_MEMORY:
        text = (
            f"needs {format_size(demand.memory_bytes)} on one GPU; largest free is "
            f"{format_size(max(0, free_memory[best_mem]))} on GPU {best_mem}"
        )
        if cap.external[best_mem]:
            text += f" ({format_size(cap.external[best_mem])} there is used outside gpuslice)"
        return text
    if free_milli[best_milli] < demand.milli:
        if demand.milli == 1:  # a memory-only share: only a whole-GPU job can block it
            return f"needs a share of one GPU; every GPU it may use ({_gpu_list(eligible)}) is held whole"
        return (
            f"needs {_percent(demand.milli)} compute on one GPU; most free is "
            f"{_percent(free_milli[best_milli])} on GPU {best_milli}"
        )
    return (
        f"needs {format_size(demand.memory_bytes)} and {_percent(demand.milli)} compute on one GPU; "
        "no GPU has both free"
    )
