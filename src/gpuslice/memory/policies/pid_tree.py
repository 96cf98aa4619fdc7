"""Per-tenant tree threshold (gpu_ext ``prefetch_pid_tree.bpf.c``): the tree-iterator rule
with the threshold from the owning tenant's priority — high 20 % (prefetches eagerly), low 80 %,
others 50 %. gpu_ext learns the owner with a kprobe; the fault carries it here."""

from __future__ import annotations

from gpuslice.memory.hooks import PRIORITY_HIGH, PRIORITY_LOW, MemoryView, PrefetchFault
from gpuslice.memory.policies.tree_iter import TreeIter

__all__ = ["PidTree"]

THRESHOLDS = {PRIORITY_HIGH: 20, PRIORITY_LOW: 80}  # the BPF program's defaults
THRESHOLD_OTHER = 50


class PidTree(TreeIter):
    name = "pid-tree"
    summary = "tree threshold per tenant: 20 % high, 80 % low, 50 % others"

    def threshold(self, view: MemoryView, fault: PrefetchFault) -> int:
        return THRESHOLDS.get(view.priority(fault.tenant), THRESHOLD_OTHER)
