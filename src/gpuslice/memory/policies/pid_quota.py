"""Per-tenant chunk quota (gpu_ext ``eviction_pid_quota.bpf.c``).

Counts active chunks per tenant (up at a chunk's first activation, down at evict-prepare when the head
chunk is one it tracks). On access, quota = active chunks of the high and low tenants × quota% / 100
(at least 1): within quota the chunk moves to TAIL (protected), over quota it stays (easier to evict);
both BYPASS. Quota 0 % means unlimited, i.e. the native LRU move. Loader defaults: high 0 % (unlimited),
low 100 %, others 0 % — so with the defaults the low tenant is never over quota and the policy equals
the driver; pass ``low_pct`` below 100 to squeeze the low tenant.
"""

from __future__ import annotations

from gpuslice.memory.hooks import (
    BYPASS,
    DEFAULT,
    PRIORITY_HIGH,
    PRIORITY_LOW,
    TAIL,
    UNUSED,
    USED,
    DecisionContext,
    EvictContext,
    MemoryOps,
    MemoryView,
)

__all__ = ["PidQuota"]


class PidQuota(MemoryOps):
    name = "pid-quota"
    summary = "tenant over its chunk quota (high 0=∞, low 100 %, other 0=∞) is not protected"
    kind = "evict"

    def __init__(self, high_pct: int = 0, low_pct: int = 100, other_pct: int = 0) -> None:
        self.pct = {PRIORITY_HIGH: high_pct, PRIORITY_LOW: low_pct}
        self.other_pct = other_pct
        self.owner_of: dict[int, int] = {}
        self.active: dict[int, int] = {}

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        if block not in self.owner_of:
            tenant = int(view.owner[block])
            self.owner_of[block] = tenant
            self.active[tenant] = self.active.get(tenant, 0) + 1

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        tenant = int(view.owner[block])
        pct = self.pct.get(view.priority(tenant), self.other_pct)
        if pct == 0:
            return DEFAULT  # unlimited: native LRU
        pair = sum(n for t, n in self.active.items() if view.priority(t) in (PRIORITY_HIGH, PRIORITY_LOW))
        quota = max(1, pair * pct // 100)
        if self.active.get(tenant, 0) <= quota:
            ctx.request_reorder(USED, TAIL)
        return BYPASS

    def evict_prepare(self, view: MemoryView, ctx: EvictContext) -> None:
        for head in view.head(UNUSED, 1) or view.head(USED, 1):
            tenant = self.owner_of.pop(head, None)
            if tenant is not None:
                self.active[tenant] -= 1
