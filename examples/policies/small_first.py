"""Small first: among jobs of the same priority, start the one asking for the fewest GPUs first.

Optimises: (priority, highest first), then GPUs asked for (a share counts as its compute fraction, an
unspecified share as one GPU), then submission order. Each tenant's jobs can be boosted by whole
priority levels through a Map an operator writes on a running server:
``gpuslice policy map update boost alice 1`` (the queue family is the default).
Where it works well: a queue of many small experiments and a few large runs; short waits for the many.
Weakness: a large job can wait as long as small ones keep arriving (no aging here; priority-fair ages).
"""

from __future__ import annotations

from typing import Any

from gpuslice.programs.api import Map, Priority, QueuedJob, QueueOps, QueueView


class SmallFirst(QueueOps):
    name = "small-first"
    summary = "priority, then fewest GPUs, then FIFO; per-tenant boosts in a map"

    boost = Map(key=str, value=int, max_entries=256)  # tenant -> extra priority levels (0..)

    def priority(self, view: QueueView, job: QueuedJob) -> int:
        own = int(job.spec.priority)
        if own >= Priority.HIGH:
            return own
        return min(int(Priority.HIGH), own + max(0, self.boost.get(job.spec.tenant, 0)))

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        spec = job.spec
        gpus = float(spec.gpus)
        if spec.gpus == 1 and 0 < spec.compute_percent < 100:
            gpus = spec.compute_percent / 100
        return (-self.priority(view, job), gpus)
