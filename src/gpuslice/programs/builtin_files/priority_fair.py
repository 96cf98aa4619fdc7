"""Priority with aging, then weighted fair share between tenants, then FIFO, as a policy file.

The built-in ``policies/queue/priority_fair.py`` rewritten against the policy API. A waiting job gains
one level per ``aging_seconds`` waited, never above HIGH; among equal levels the tenant with the least
GPU usage per weight goes first.
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import Priority, QueuedJob, QueueOps, QueueView


class PriorityFair(QueueOps):
    name = "priority-fair"
    summary = "strict priority with aging, then tenant usage / weight, then FIFO"

    def priority(self, view: QueueView, job: QueuedJob) -> int:
        own = int(job.spec.priority)
        if own >= Priority.HIGH or view.aging_seconds <= 0:
            return own
        waited = max(0.0, view.now - job.submitted_at)
        return min(int(Priority.HIGH), own + int(waited // view.aging_seconds))

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        share = view.usage(job.spec.tenant) / view.weight(job.spec.tenant)
        return (-self.priority(view, job), share)
