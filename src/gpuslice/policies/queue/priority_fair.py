"""Priority, then weighted fair share between tenants, then FIFO; waiting jobs age up.

Optimises, in this order (lexicographic, lower key first):
1. the job's level, highest first, where a waiting job gains one level per ``aging_seconds`` waited,
   never above HIGH (a LOW job that has waited two periods competes as HIGH; REALTIME stays on top);
2. its tenant's GPU usage divided by the tenant's weight, lowest first: the tenant furthest below its
   fair share goes next (usage is re-read after every start, so two equal tenants alternate);
3. submission order.
Where it works well: a shared team machine with a few tenants and a few urgent jobs.
Weakness: fair share looks at GPUs held now, not GPU-hours consumed, so a tenant whose jobs are short
gets no credit for the time it stayed off the machine.
"""

from __future__ import annotations

from typing import Any

from gpuslice.policies.queue.base import QueuedJob, QueueOps, QueueView
from gpuslice.workload.job import Priority

__all__ = ["PriorityFair"]


class PriorityFair(QueueOps):
    name = "priority-fair"
    summary = "strict priority with aging, then tenant usage / weight, then FIFO"
    # aging raises a level with the time waited, and usage / weight is the tenant's: within one tenant and
    # own priority an earlier job's key is never larger (the queue may be merged from FIFO groups)
    key_follows_submission = True

    def priority(self, view: QueueView, job: QueuedJob) -> int:
        own = int(job.spec.priority)
        if own >= Priority.HIGH or view.aging_seconds <= 0:
            return own
        waited = max(0.0, view.now - job.submitted_at)
        return min(int(Priority.HIGH), own + int(waited // view.aging_seconds))

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        share = view.usage(job.spec.tenant) / view.weight(job.spec.tenant)
        return (-self.priority(view, job), share)
