"""The node scheduler of ``gpuslice serve``: who starts where on one machine, who is preempted, who waits.

Pure and deterministic: no I/O, no clock (the caller passes ``now``), same calls → same decisions.
Capacity, MIG instances included, lives in a one-node ``Ledger``; every start is a validated
``Ledger.reserve`` (``reserve_mig`` for a MIG instance), so no sequence of calls can over-commit a GPU.
One ``step``:

```text
order = queue policy order of the pending jobs           (policies/queue; re-sorted after each start)
for job in order:
    tenant at quota?                  -> waits: "tenant ml at its quota of 4 GPUs"
    a head job is blocked, no backfill -> waits behind it
    fits now? (gang: all its GPUs or none)
        no  -> first such job is the head: preempt what the one search finds (preemption.py, asking
               the queue policy's may_preempt) and take an EASY reservation (backfill.py); later ones wait
        yes -> would it delay the head's reservation?  -> waits "behind … (backfill would delay it)"
               else GPUs: a MIG slot (node_fit), or the shared placer's choice under the placement
               policy (node_gpu_choice.py, as in sim and the extender) -> ledger.reserve -> StartJob
```

Unhealthy GPUs (``set_gpu_health``: an XID, an ECC error, or marked by hand) take no new job: every
fit question is asked of the job's demand without them (``_usable``), and a job that waits because of
them says so ("…; GPU 3 is unhealthy (XID 79): no new jobs go there"). Jobs running there keep running;
reporting them is the daemon's part.

Known limits, by design: only the head job preempts (one plan at a time, like EASY's one reservation).
Memory held outside gpuslice (``set_external_usage``) is a pseudo-placement of 1 milli plus the memory,
so a GPU someone else uses is no longer whole; it is clamped to what is free and re-taken as jobs
finish. On MIG GPUs it is only shown, since MIG slots, not free bytes, decide there.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuslice.errors import InternalError, InvalidRequest
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import format_mask, mig_gpu
from gpuslice.ledger.ledger import Ledger, LedgerView
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode
from gpuslice.policies.base import PlacementOps, PolicyContext
from gpuslice.policies.bestfit import BestFit
from gpuslice.policies.mig_placement import DEFAULT_MIG_PLACEMENT, mig_placement_policy
from gpuslice.policies.queue import (
    DEFAULT_QUEUE_POLICY,
    JobRef,
    QueuedJob,
    QueueView,
    effective_priority,
    order_pending,
)
from gpuslice.policies.queue import queue_policy as lookup_queue_policy
from gpuslice.scheduler import backfill
from gpuslice.scheduler.node_decisions import GpuUsage, MigAssignment, PreemptJob, StartJob
from gpuslice.scheduler.node_fit import (
    Choice,
    Demand,
    DemandKind,
    Holding,
    MachineWhatIf,
    adopted_holding,
    choose_mig,
    demand_for,
    fits,
    why_not,
)
from gpuslice.scheduler.node_gpu_choice import NodeGpuChoice
from gpuslice.scheduler.preemption import Victim, find_preemption
from gpuslice.scheduler.quota import (
    TenantQuota,
    check_fits_quota,
    held_gpus,
    least_use,
    memory_of,
    memory_on,
    most_gpus,
    never_reason,
    quota_reason,
    tenant_usage,
)
from gpuslice.scheduler.reasons import PendingReason
from gpuslice.workload.job import DEFAULT_GRACE_SECONDS, JobSpec
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

__all__ = ["GpuUsage", "MigAssignment", "NodeScheduler", "PreemptJob", "StartJob", "TenantQuota"]

SUBMITTED_REASON = PendingReason.of(RefusalCode.NOT_TRIED, "submitted; waiting for the next scheduling pass")


@dataclass
class _Pending:
    queued: QueuedJob
    demand: Demand
    reason: PendingReason = SUBMITTED_REASON


@dataclass
class _Running:
    job_id: str
    spec: JobSpec
    holding: Holding
    placement: Placement
    started_at: float
    seq: int
    preempt_at: float | None = None  # set when a PreemptJob for it was issued
    mig: MigAssignment | None = None


@dataclass
class _Pass:
    """State of one step: the capacity now, the head job and its reservation, decisions so far."""

    cap: MachineWhatIf
    decisions: list[StartJob | PreemptJob] = field(default_factory=list)
    head: _Pending | None = None
    head_level: int = 0
    reservation: backfill.Shadow | None = None
    failed: dict[Demand, PendingReason] = field(default_factory=dict)  # shapes that failed; cleared on start
    later: list[_Pending] = field(default_factory=list)  # queued after the job considered now
    # The requests of the known jobs, taken once per pass when the placement needs them: a start moves a
    # job from pending to running under the same request, so the set does not change within a pass.
    shapes: frozenset[Request] | None = None


class NodeScheduler:
    """See the module docstring; the contract is docs/serve-design.md."""

    def __init__(
        self,
        machine: Machine,
        *,
        tenants: Mapping[str, TenantQuota] = {},  # read only; the contract's signature
        queue_policy: str = DEFAULT_QUEUE_POLICY,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        aging_seconds: float = 600.0,
        backfill: bool = True,
        placement: Callable[[LedgerView, PolicyContext], PlacementOps] = BestFit,
        target: TargetWorkload | None = None,
    ) -> None:
        """``placement`` builds the placement policy (a registered class, or a policy file's guarded
        factory) that advises which GPUs a share or whole-GPU job gets, through the same ``Placer`` as
        sim and the Kubernetes extender. ``target`` is the workload FGD-style policies measure
        fragmentation against; without one, the shapes of the jobs this scheduler knows are used."""
        self.machine = machine
        self.tenants = dict(tenants)
        self.policy = lookup_queue_policy(queue_policy)()
        self.grace_seconds = grace_seconds
        self.aging_seconds = aging_seconds
        self.backfill = backfill
        self.fallbacks: Counter[str] = Counter()  # queue-policy and MIG-slot answers replaced by the default
        # MIG instances are held in the ledger too (``Ledger.reserve_mig``), with their share of the GPU.
        mig = {(0, g.index): mig_gpu(g.mig_model) for g in machine.gpus if g.mig_enabled}
        self.ledger = Ledger([machine.node_spec()], mig=mig)
        self.gpu_choice = NodeGpuChoice(self.ledger, machine.topology, placement, target)
        self._n = machine.gpu_count
        self._mig_policy = mig_placement_policy(DEFAULT_MIG_PLACEMENT)()
        self._pending: dict[str, _Pending] = {}
        self._running: dict[str, _Running] = {}
        self._external = [0] * self._n
        self._external_placement: list[Placement | None] = [None] * self._n
        self._order: list[str] = []  # pending ids in the order of the last step
        self._preempted_for: dict[str, str] = {}  # victim id -> the job it makes room for
        self._seq = 0
        self._start_seq = 0
        self._now = 0.0  # time of the last step, for hooks called outside one
        self._unhealthy: dict[int, str] = {}  # GPU -> why it takes no new jobs
        self._usable_cache: dict[Demand, Demand] = {}  # demand -> demand without unhealthy GPUs

    # ---- changes from the daemon ---------------------------------------------------------------------

    def submit(self, job_id: str, spec: JobSpec, now: float, *, admitted: bool = False) -> None:
        """Queue a job; InvalidRequest (naming the field) if it can never run on this machine, and
        QuotaNeverFits if it needs more than its tenant's whole quota. A job ``admitted`` before (a
        requeue, a server restart) is queued whatever the quota says now: a quota lowered under it makes
        it wait with "can never run under quota …" (``set_tenants``), it is never dropped."""
        self._check_new(job_id)
        demand = demand_for(spec, self.machine)
        if not admitted:
            check_fits_quota(self.tenants.get(spec.tenant), spec.tenant, self.machine, demand)
        pending = _Pending(QueuedJob(job_id, spec, now, self._seq), demand)
        pending.reason = self._never_reason(pending) or SUBMITTED_REASON
        self._pending[job_id] = pending
        self._seq += 1

    def set_tenants(self, tenants: Mapping[str, TenantQuota]) -> list[str]:
        """Replace the tenants' weights and quotas; the pending jobs their quota now never admits (and did
        before) are returned, each waiting with that reason from now on."""
        before = set(self.never_runs())
        self.tenants = dict(tenants)
        for job_id, reason in (now := self.never_runs()).items():
            self._pending[job_id].reason = reason
        return [job_id for job_id in now if job_id not in before]

    def never_runs(self) -> dict[str, PendingReason]:
        """Pending jobs their tenant's quota can never admit, with the reason they show."""
        return {i: why for i, j in self._pending.items() if (why := self._never_reason(j)) is not None}

    def cancel(self, job_id: str) -> None:
        """Drop a pending job. A running or unknown job is left alone (the daemon stops running ones)."""
        if self._pending.pop(job_id, None) is not None and job_id in self._order:
            self._order.remove(job_id)

    def finished(self, job_id: str) -> None:
        """A running job ended, its capacity is released. Idempotent: unknown ids are ignored."""
        run = self._running.pop(job_id, None)
        if run is None:
            return
        self._preempted_for.pop(job_id, None)
        self.ledger.release(run.placement)
        for g in run.holding.gpus:
            self._sync_external(g)
        view = self._view(self._now)
        self.policy.on_finished(view, QueuedJob(job_id, run.spec, run.started_at, run.seq))

    def adopt(
        self,
        job_id: str,
        spec: JobSpec,
        gpus: tuple[int, ...],
        started_at: float,
        mig: MigAssignment | None = None,
    ) -> None:
        """Re-add a job that is running already (after a server restart). InvalidRequest, and nothing
        changed, when its GPUs or MIG slot conflict with what is already recorded."""
        self._check_new(job_id)
        demand = demand_for(spec, self.machine)
        holding = adopted_holding(job_id, demand, tuple(int(g) for g in gpus), mig, self.ledger, self.machine)
        self._reserve(job_id, spec, holding, started_at, mig, adopting=True)

    def set_external_usage(self, gpu: int, memory_bytes: int) -> None:
        """GPU memory held by processes gpuslice did not start: taken from what shares may use."""
        if not 0 <= gpu < self._n:
            raise InvalidRequest(f"gpu: GPU {gpu} does not exist (this machine has 0–{self._n - 1})")
        self._external[gpu] = max(0, int(memory_bytes))
        self._sync_external(gpu)

    def set_gpu_health(self, gpu: int, healthy: bool, reason: str = "") -> None:
        """Mark a GPU unhealthy (no new job goes there, from the next step) or healthy again. Running
        jobs are not touched. InvalidRequest for a GPU that does not exist."""
        if not 0 <= gpu < self._n:
            raise InvalidRequest(f"gpu: GPU {gpu} does not exist (this machine has 0–{self._n - 1})")
        if healthy:
            self._unhealthy.pop(gpu, None)
        else:
            self._unhealthy[gpu] = reason or "marked unhealthy"
        self._usable_cache.clear()

    def unhealthy_gpus(self) -> dict[int, str]:
        """GPU index -> why it takes no new jobs."""
        return dict(self._unhealthy)

    # ---- decisions -----------------------------------------------------------------------------------

    def step(self, now: float) -> list[StartJob | PreemptJob]:
        """Decide who starts and who is preempted now; started jobs are running when this returns."""
        self._now = now
        p = _Pass(cap=self._capacity())
        order = self._ordered(now, list(self._pending.values()))
        index = 0
        while index < len(order):
            job = order[index]
            index += 1
            p.later = order[index:]
            started = self._consider(job, now, p)
            if started and index < len(order):  # tenant usage changed: re-sort what is left
                order[index:] = self._ordered(now, order[index:])
        self._order = [j.queued.job_id for j in order if j.queued.job_id in self._pending]
        return p.decisions

    def _consider(self, job: _Pending, now: float, p: _Pass) -> bool:
        spec = job.queued.spec
        least = least_use(self.machine, job.demand)
        quota = self._never_reason(job) or self._quota_reason(spec.tenant, *least)
        if quota is not None:
            job.reason = quota
            return False
        if p.head is not None and not self.backfill:
            job.reason = self._behind(job, now, p, "backfill is off")
            return False
        usable = self._usable(job.demand)
        choice = None if usable in p.failed else self._choose(usable, p)
        if choice is None:
            reason = p.failed.get(usable) or self._why_not(job.demand, usable, p.cap)
            p.failed[usable] = reason
            if p.head is None:
                reason = self._block_head(job, now, p, reason)
            job.reason = reason
            return False
        exact = self._quota_reason(
            spec.tenant, held_gpus(self.machine, choice.holding), memory_of(self.machine, choice.holding)
        )
        if exact is not None:
            job.reason = exact
            return False
        if p.head is not None:
            end = now + spec.max_runtime_seconds if spec.max_runtime_seconds else math.inf
            if not backfill.allows(p.reservation, choice.holding.placement, end, self._fits_head(p)):
                job.reason = self._behind(job, now, p, "backfill would delay it")
                return False
        mig = self._assignment(choice)
        self._reserve(job.queued.job_id, spec, choice.holding, now, mig, adopting=False)
        del self._pending[job.queued.job_id]
        p.cap = self._capacity()  # read again from the ledger, the one owner of what is free
        p.failed.clear()
        p.decisions.append(StartJob(job.queued.job_id, choice.gpus, mig))
        self.policy.on_started(self._view(now), job.queued)
        return True

    def _block_head(self, job: _Pending, now: float, p: _Pass, reason: PendingReason) -> PendingReason:
        """``job`` is the first that does not fit: plan preemption and take its backfill reservation."""
        p.head = job
        p.head_level = effective_priority(self.policy, self._view(now), job.queued, self.fallbacks)
        head_id = job.queued.job_id
        in_flight = sorted(r.job_id for r in self._running.values() if r.preempt_at is not None)
        mine = [r for r in in_flight if self._preempted_for.get(r) == head_id]
        if mine:
            reason = PendingReason(
                reason.refusal,
                f"waiting for preempted job(s) {', '.join(mine)} to stop (grace {self.grace_seconds:g} s)",
            ).recoded(_preempting(reason))
        else:
            victims = self._victims(job, now, p.cap) if self._may_preempt(job) else None
            if victims:
                for v in victims:
                    run = self._running[v.job_id]
                    run.preempt_at = now
                    self._preempted_for[v.job_id] = head_id
                    p.decisions.append(PreemptJob(v.job_id, head_id, self.grace_seconds))
                names = ", ".join(v.job_id for v in victims)
                reason = PendingReason(
                    reason.refusal,
                    f"preempting lower-priority job(s) {names} (grace {self.grace_seconds:g} s); {reason}",
                ).recoded(_preempting(reason))
        running = [(self._expected_end(r), r.placement) for r in self._by_start()]
        p.reservation = backfill.shadow(p.cap, running, self._fits_head(p))
        return reason

    def _victims(self, job: _Pending, now: float, cap: MachineWhatIf) -> tuple[Victim, ...] | None:
        """``find_preemption`` over the running jobs on GPUs the head may use, not preempted already."""
        spec, demand = job.queued.spec, self._usable(job.demand)
        running = [
            Victim(r.job_id, int(r.spec.priority), r.started_at, held_gpus(self.machine, r.holding),
                   tenant=r.spec.tenant, preemptible=r.spec.preemptible, holding=r.placement)
            for r in self._by_start()
            if r.preempt_at is None and set(demand.eligible) & set(r.holding.gpus)
        ]  # fmt: skip

        def fits_without(_node: object, victims: tuple[Victim, ...]) -> bool:
            trial = MachineWhatIf(cap.row.given(v.holding for v in victims), cap.external)
            return fits(demand, trial, self.machine.topology)

        head, view = JobRef(job.queued.job_id, int(spec.priority), spec.tenant), self._view(now)
        plan = find_preemption(head, running, fits_without, now, policy=self.policy, view=view,
                               fallbacks=self.fallbacks)  # fmt: skip
        return None if plan is None else plan.victims

    def _behind(self, job: _Pending, now: float, p: _Pass, why: str) -> PendingReason:
        assert p.head is not None
        level = effective_priority(self.policy, self._view(now), job.queued, self.fallbacks)
        kind = "higher-priority" if p.head_level > level else "earlier"
        return PendingReason.of(
            RefusalCode.BEHIND_QUEUE_HEAD, f"waiting behind {kind} job {p.head.queued.job_id} ({why})"
        )

    # ---- reads ---------------------------------------------------------------------------------------

    def pending_reason(self, job_id: str) -> str:
        """Why a pending job is not running, as of the last step. KeyError if it is not pending."""
        try:
            return self._pending[job_id].reason.text
        except KeyError:
            raise KeyError(f"job {job_id!r} is not pending") from None

    def queue(self) -> list[tuple[str, str]]:
        """Pending jobs in the order they would start (last step's order, newer ones after), with reasons."""
        return [(i, reason.text) for i, reason in self.waiting()]

    def waiting(self) -> list[tuple[str, PendingReason]]:
        """``queue`` with each job's whole reason: the refusal record (code, amounts) and the sentence."""
        seen = [i for i in self._order if i in self._pending]
        known = set(seen)
        rest = sorted((j for i, j in self._pending.items() if i not in known), key=lambda j: j.queued.seq)
        return [(i, self._pending[i].reason) for i in seen] + [(j.queued.job_id, j.reason) for j in rest]

    def pending_codes(self) -> list[tuple[str, RefusalCode]]:
        """Each pending job's reason code, as of the last step (for the metrics' ``reason`` label)."""
        return [(i, j.reason.code) for i, j in self._pending.items()]

    def pending_code(self, job_id: str) -> RefusalCode:
        """The code of ``pending_reason(job_id)``. KeyError if it is not pending."""
        return self.pending_refusal(job_id).code

    def pending_refusal(self, job_id: str) -> Refusal:
        """The refusal record behind ``pending_reason(job_id)``: its code and amounts. KeyError if the job
        is not pending."""
        try:
            return self._pending[job_id].reason.refusal
        except KeyError:
            raise KeyError(f"job {job_id!r} is not pending") from None

    def tenant_usage(self) -> dict[str, tuple[float, int]]:
        """Per tenant with running jobs: the GPUs and GPU memory they hold, as the quotas count them."""
        return tenant_usage(self.machine, ((r.spec.tenant, r.holding) for r in self._running.values()))

    def running(self) -> dict[str, tuple[int, ...]]:
        """Running job ids (including those being preempted) and their GPUs, in start order."""
        return {r.job_id: r.holding.gpus for r in self._by_start()}

    def running_specs(self) -> dict[str, tuple[JobSpec, MigAssignment | None]]:
        """Running job ids with their spec and MIG instance, in start order (reads need no store)."""
        return {r.job_id: (r.spec, r.mig) for r in self._by_start()}

    def gpu_usage(self) -> list[GpuUsage]:
        view, out = self.ledger.view, []
        for gpu in self.machine.gpus:
            g, held = gpu.index, [r for r in self._by_start() if gpu.index in r.holding.gpus]
            used = sum(memory_on(self.machine, r.holding, g) for r in held)
            layout = self.ledger.mig_layout(0, g)
            out.append(GpuUsage(
                index=g, model=gpu.model, memory_total_bytes=gpu.memory_bytes,
                memory_free_bytes=max(0, gpu.memory_bytes - used - self._external[g]),
                compute_free_milli=int(view.free_gpu_milli[0, g]), job_ids=tuple(r.job_id for r in held),
                external_bytes=self._external[g], mig_enabled=gpu.mig_enabled,
                mig_slots=format_mask(layout.mask) if layout is not None else "",
                unhealthy_reason=self._unhealthy.get(g, ""),
            ))  # fmt: skip
        return out

    # ---- helpers -------------------------------------------------------------------------------------

    def _check_new(self, job_id: str) -> None:
        if not job_id:
            raise InvalidRequest("job_id: cannot be empty")
        if job_id in self._pending or job_id in self._running:
            state = "pending" if job_id in self._pending else "running"
            raise InvalidRequest(f"job_id: {job_id!r} is already {state}; finish or cancel it first")

    def _by_start(self) -> list[_Running]:
        return sorted(self._running.values(), key=lambda r: r.seq)

    def _view(self, now: float) -> QueueView:
        usage: dict[str, float] = {}
        for r in self._running.values():
            usage[r.spec.tenant] = usage.get(r.spec.tenant, 0.0) + held_gpus(self.machine, r.holding)
        weights = {name: q.weight for name, q in self.tenants.items()}
        return QueueView(now, self.aging_seconds, weights, usage)

    def _ordered(self, now: float, jobs: list[_Pending]) -> list[_Pending]:
        by_id = {j.queued.job_id: j for j in jobs}
        ordered = order_pending(self.policy, self._view(now), [j.queued for j in jobs], self.fallbacks)
        return [by_id[q.job_id] for q in ordered]

    def _choose(self, demand: Demand, p: _Pass) -> Choice | None:
        """The GPUs the job gets now: MIG slots here, shares and whole GPUs from the shared placer. The
        pass's capacity is read from the ledger after every start (every start reserves at once), so
        both see the same free capacity."""
        if demand.kind is DemandKind.MIG:
            return choose_mig(demand, p.cap, self._mig_policy, self.fallbacks)
        if not fits(demand, p.cap, self.machine.topology):
            return None
        if p.shapes is None:
            p.shapes = frozenset(self._known_shapes()) if self.gpu_choice.target is None else frozenset()
        return self.gpu_choice.choose(demand, p.shapes, (self._usable(j.demand) for j in p.later))

    def _known_shapes(self) -> list[Request]:
        """The share and whole-GPU requests of the pending and running jobs (what FGD-style policies keep
        room for, when no target workload is given)."""
        kinds = (DemandKind.SHARE, DemandKind.WHOLE)
        pending = [j.demand.request for j in self._pending.values() if j.demand.kind in kinds]
        return pending + [
            r.placement.request for r in self._running.values() if r.mig is None and r.holding.gpus
        ]

    def _fits_head(self, p: _Pass) -> Callable[[MachineWhatIf], bool]:
        assert p.head is not None
        demand, topology = self._usable(p.head.demand), self.machine.topology
        return lambda cap: fits(demand, cap, topology)

    def _usable(self, demand: Demand) -> Demand:
        """``demand`` without the unhealthy GPUs (the same object when every GPU is healthy)."""
        if not self._unhealthy or demand.kind is DemandKind.NONE:
            return demand
        usable = self._usable_cache.get(demand)
        if usable is None:
            bad = self._unhealthy
            usable = dataclasses.replace(
                demand,
                eligible=tuple(g for g in demand.eligible if g not in bad),
                mig_options=tuple((g, ps) for g, ps in demand.mig_options if g not in bad),
            )
            self._usable_cache[demand] = usable
        return usable

    def _why_not(self, demand: Demand, usable: Demand, cap: MachineWhatIf) -> PendingReason:
        """why_not, plus the unhealthy GPUs the job could otherwise have used."""
        lost = [g for g in demand.eligible if g in self._unhealthy]
        if not lost:
            return why_not(usable, cap, self.machine.topology)
        sick = "; ".join(f"GPU {g} is unhealthy ({self._unhealthy[g]})" for g in lost)
        sick += ": no new jobs go there"
        if len(usable.eligible) < max(1, usable.count):
            left = len(usable.eligible)
            text = f"needs {max(1, usable.count)} GPU(s) it may use; only {left} healthy; {sick}"
            return PendingReason.of(RefusalCode.UNHEALTHY_GPU, text)
        return why_not(usable, cap, self.machine.topology).then(sick).recoded(RefusalCode.UNHEALTHY_GPU)

    def _expected_end(self, r: _Running) -> float:
        ends = [math.inf]
        if r.spec.max_runtime_seconds:
            ends.append(r.started_at + r.spec.max_runtime_seconds)
        if r.preempt_at is not None:
            ends.append(r.preempt_at + self.grace_seconds)
        return min(ends)

    def _capacity(self) -> MachineWhatIf:
        return MachineWhatIf(self.ledger.row(0), self._external)

    def _never_reason(self, job: _Pending) -> PendingReason | None:
        tenant = job.queued.spec.tenant
        return never_reason(self.tenants.get(tenant), tenant, self.machine, job.demand)

    def _may_preempt(self, job: _Pending) -> bool:
        """The quota has room for the most the job could count as (quota.py: never evict, then wait)."""
        gpus, memory = most_gpus(self.machine, job.demand), least_use(self.machine, job.demand)[1]
        return self._quota_reason(job.queued.spec.tenant, gpus, memory) is None

    def _quota_reason(self, tenant: str, gpus: float, memory: int) -> PendingReason | None:
        held = (r.holding for r in self._running.values() if r.spec.tenant == tenant)
        return quota_reason(self.tenants.get(tenant), tenant, self.machine, held, gpus, memory)

    def _assignment(self, choice: Choice) -> MigAssignment | None:
        mig = choice.holding.mig
        return None if mig is None else MigAssignment(choice.gpus[0], mig.profile.name, mig.start)

    def _reserve(
        self,
        job_id: str,
        spec: JobSpec,
        holding: Holding,
        started_at: float,
        mig: MigAssignment | None,
        *,
        adopting: bool,
    ) -> None:
        """Record a running job through ``Ledger.reserve``. ``adopt`` and ``step`` have checked the fit
        already, so a refusal here is a bug in gpuslice (InternalError, everything left unchanged)."""
        gpus = holding.gpus
        if holding.request is None:
            raise InternalError(f"bug: job {job_id}'s holding carries no ledger request")
        if holding.mig is not None:
            result = self.ledger.reserve_mig(0, gpus[0], holding.mig, holding.request)
        else:
            result = self.ledger.reserve(0, gpus, holding.request)
        if isinstance(result, Refusal):
            what = "adopt" if adopting else "start"
            raise InternalError(f"bug: the ledger refused to {what} job {job_id} on GPU {list(gpus)} "
                                f"after its fit was checked: {result}")  # fmt: skip
        self._running[job_id] = _Running(job_id, spec, holding, result, started_at, self._start_seq, mig=mig)
        self._start_seq += 1

    def _sync_external(self, g: int) -> None:
        """Re-take GPU ``g``'s outside memory as a pseudo-placement, clamped to what is free now."""
        old = self._external_placement[g]
        if old is not None:
            self.ledger.release(old)
            self._external_placement[g] = None
        want = self._external[g]
        if not want or self.ledger.mig_layout(0, g) is not None:
            return
        view = self.ledger.view
        if view.free_gpu_milli[0, g] < 1:
            return  # a whole-GPU job holds it; taken again when that job finishes
        take = min(want, int(view.free_gpu_memory_bytes[0, g]))
        result = self.ledger.reserve(
            0, (g,), Request(cpu_milli=0, num_gpu=1, gpu_milli=1, gpu_memory_bytes=take)
        )
        if isinstance(result, Placement):
            self._external_placement[g] = result


def _preempting(base: PendingReason) -> RefusalCode:
    """A head job that preempts is PREEMPTING, unless unhealthy GPUs are what it waits for."""
    return base.code if base.code is RefusalCode.UNHEALTHY_GPU else RefusalCode.PREEMPTING
