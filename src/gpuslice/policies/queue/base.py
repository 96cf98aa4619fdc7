"""The queue ops table: in which order pending jobs are tried, and the mechanism that applies it.

Lifecycle of one job in the node scheduler (``scheduler/node_scheduler.py``), hooks marked ``policy.``:

```text
submit(job)                      -> pending
step(now):
    view  = QueueView(now, tenant weights, tenant GPU usage, aging_seconds)
    order = order_pending(policy, view, pending)     # sorted by policy.order_key(view, job), then FIFO;
                                                     # the key usually starts with -policy.priority(...)
    for job in order:                                # re-sorted after every start (usage changed)
        quota?  fits now?  backfill would delay the head?  preempt lower-priority jobs?   (mechanism)
            each running job the mechanism would let go: policy.may_preempt(view, head, victim)
        start -> policy.on_started(view, job)
finished(job)                    -> policy.on_finished(view, job)
```

A policy only advises an order and who may be preempted (DESIGN.md "policy advises, mechanism
decides"): quotas, gang starts, backfill and the preemption search (``scheduler/preemption.py``) are the
mechanism's, and a hook that raises or answers out of range is replaced by the default answer and
counted in ``fallbacks`` (STYLE.md habit 5). Priorities are ``Priority`` levels; a policy may raise a
waiting job's level (aging) but never above HIGH, and never lower it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuslice.advice import ask
from gpuslice.workload.job import JobSpec, Priority

__all__ = [
    "JobRef",
    "QueueOps",
    "QueueView",
    "QueuedJob",
    "effective_priority",
    "may_preempt",
    "order_pending",
]


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A pending job as a queue policy sees it. ``seq`` is the submission order (FIFO tie-break)."""

    job_id: str
    spec: JobSpec
    submitted_at: float
    seq: int


@dataclass(frozen=True, slots=True)
class JobRef:
    """A job (serve) or pod (Kubernetes) in a preemption question, as a queue policy sees it: its id,
    its own priority (aging never counts here), its tenant or namespace, and when it started (seconds;
    0 for a job that waits)."""

    job_id: str
    priority: int
    tenant: str = ""
    started_at: float = 0.0


@dataclass(frozen=True, slots=True)
class QueueView:
    """What a queue policy may read at one step: the time, tenants' weights and current GPU usage.

    ``tenant_gpus`` counts GPUs held by running jobs as quotas do (``workload/equivalent.py``): a whole
    GPU is 1, a share the larger of its compute and memory fractions of its GPU, a MIG instance its
    compute slices / 7. Tenants missing from a map have weight 1 and usage 0.
    """

    now: float
    aging_seconds: float = 600.0
    tenant_weight: Mapping[str, float] = field(default_factory=dict)
    tenant_gpus: Mapping[str, float] = field(default_factory=dict)

    def weight(self, tenant: str) -> float:
        return self.tenant_weight.get(tenant, 1.0)

    def usage(self, tenant: str) -> float:
        return self.tenant_gpus.get(tenant, 0.0)


class QueueOps:
    """Base of every queue policy. Only ``name`` is required; each hook has a working default."""

    name: ClassVar[str] = "default"
    summary: ClassVar[str] = "strict priority, then FIFO (the defaults)"
    # False where ``order_key`` reads only the job, never the view: a waiting job's key then never
    # changes, and a home may keep the order as jobs come and go instead of sorting at every step.
    # True (the safe answer) for any policy that does not say so, subclasses and policy files included.
    key_reads_view: ClassVar[bool] = True
    # True where, among waiting jobs of one tenant and one own priority, a job submitted earlier never
    # gets a larger key than one submitted later, at any view (the key reads the view only through the
    # time waited, which never lowers a level, and the tenant's usage, which the group shares). A home
    # may then keep each such group in submission order and merge the groups instead of sorting. Counts
    # only where the class that defines ``order_key`` / ``priority`` sets it.
    key_follows_submission: ClassVar[bool] = False

    def priority(self, view: QueueView, job: QueuedJob) -> int:
        """The job's level now. Called at every step for every pending job; must be a ``Priority``
        value between the job's own level and max(own level, HIGH). Default: the job's own level."""
        return int(job.spec.priority)

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        """Sort key, lower goes first; the mechanism appends ``job.seq`` so ties stay FIFO and the order
        is total. Keys of one step must compare with each other. Default: higher ``priority`` first."""
        return (-self.priority(view, job),)

    def may_preempt(self, view: QueueView, preemptor: JobRef, victim: JobRef) -> bool:
        """May ``preemptor`` evict the running ``victim``? Asked only for victims the mechanism allows
        already (preemptible, strictly lower own priority), so a policy can protect a job, never expose
        one. Default: True."""
        return True

    def on_started(self, view: QueueView, job: QueuedJob) -> None:
        """Called after the mechanism started ``job``. Default: nothing (usage is in the next view)."""

    def on_finished(self, view: QueueView, job: QueuedJob) -> None:
        """Called after a running job ended, for any reason. Default: nothing."""


def effective_priority(
    policy: QueueOps, view: QueueView, job: QueuedJob, fallbacks: Counter[str] | None = None
) -> int:
    """``policy.priority`` validated: an exception or a level outside [own, max(own, HIGH)] gives the
    job's own level, and ``fallbacks["priority"]`` goes up by one."""
    own = int(job.spec.priority)
    advice = ask(
        lambda: policy.priority(view, job),
        lambda level: isinstance(level, int) and own <= level <= max(own, int(Priority.HIGH)),
        lambda: own,
    )
    if not advice.followed and fallbacks is not None:
        fallbacks["priority"] += 1
    return int(advice.value)


def may_preempt(
    policy: QueueOps,
    view: QueueView,
    preemptor: JobRef,
    victim: JobRef,
    fallbacks: Counter[str] | None = None,
) -> bool:
    """``policy.may_preempt`` validated: anything but a bool, or an exception, gives the default (True)
    and ``fallbacks["may_preempt"]`` goes up by one."""
    advice = ask(
        lambda: policy.may_preempt(view, preemptor, victim), lambda v: isinstance(v, bool), lambda: True
    )
    if not advice.followed and fallbacks is not None:
        fallbacks["may_preempt"] += 1
    return bool(advice.value)


def order_pending(
    policy: QueueOps, view: QueueView, jobs: Sequence[QueuedJob], fallbacks: Counter[str] | None = None
) -> list[QueuedJob]:
    """``jobs`` in the order the policy advises (key, then FIFO). If any key raises or keys do not
    compare, the default order (own priority, then FIFO) is used and ``fallbacks["order_key"]`` counted."""

    def advised() -> list[QueuedJob]:  # a key of the wrong shape, or keys that do not compare, raise here
        batch = getattr(policy, "order_keys", None)  # a policy in a worker process: one round trip
        keys = batch(view, list(jobs)) if batch is not None else [policy.order_key(view, j) for j in jobs]
        keyed = [((*key, j.seq), j) for key, j in zip(keys, jobs, strict=True)]
        keyed.sort(key=lambda pair: pair[0])
        return [j for _, j in keyed]

    advice = ask(advised, lambda _: True, lambda: sorted(jobs, key=lambda j: (-int(j.spec.priority), j.seq)))
    if not advice.followed and fallbacks is not None:
        fallbacks["order_key"] += 1
    return advice.value
