"""Memory policies, one per file, and their registries (names are the CLI's ``--evict``/``--prefetch``).

| eviction      | rule                                                         | source (research) |
|---------------|--------------------------------------------------------------|-------------------|
| default       | driver LRU at activation                                     | §3                |
| fifo          | order of activation, accesses never move                     | §2.1              |
| lfu           | new chunk at head, access → freq+1 and tail                  | §2.1              |
| mru           | gpu_ext's: new at tail, used → head (FIFO without hits)      | §2.1              |
| mru-textbook  | textbook MRU: new or used → head                             | caching texts     |
| freq-decay    | tail every N-th access, N per tenant                         | §2.1              |
| fifo-chance   | second chances per tenant at evict-prepare                   | §2.1              |
| pid-quota     | tenants over quota are not protected                         | §2.1              |
| 2q            | probation at head until seen in two episodes                 | §2.1              |
| priority      | freq-decay half of the per-tenant priority policy            | §2.2              |
| belady        | offline MIN (the bound)                                      | issue 5           |

Prefetch: none, tree (driver), always-max, adaptive-seq, tree-iter, stride, pid-tree, priority.
"""

from __future__ import annotations

from gpuslice.errors import UnknownPolicy
from gpuslice.memory.hooks import Composed, MemoryOps
from gpuslice.memory.policies.adaptive_sequential import AdaptiveSequential
from gpuslice.memory.policies.always_max import AlwaysMax
from gpuslice.memory.policies.belady import Belady
from gpuslice.memory.policies.default import DriverDefault
from gpuslice.memory.policies.fifo import Fifo
from gpuslice.memory.policies.fifo_chance import FifoChance
from gpuslice.memory.policies.freq_decay import FreqDecay
from gpuslice.memory.policies.lfu import Lfu
from gpuslice.memory.policies.mru import Mru, MruTextbook
from gpuslice.memory.policies.pid_quota import PidQuota
from gpuslice.memory.policies.pid_tree import PidTree
from gpuslice.memory.policies.prefetch_none import PrefetchNone
from gpuslice.memory.policies.priority import Priority
from gpuslice.memory.policies.stride import Stride
from gpuslice.memory.policies.tree import DriverTree
from gpuslice.memory.policies.tree_iter import TreeIter
from gpuslice.memory.policies.two_q import TwoQ

__all__ = ["EVICTION", "PREFETCH", "UnknownMemoryPolicy", "make_ops"]

EVICTION: dict[str, type[MemoryOps]] = {
    p.name: p
    for p in (
        DriverDefault,
        Fifo,
        Lfu,
        Mru,
        MruTextbook,
        FreqDecay,
        FifoChance,
        PidQuota,
        TwoQ,
        Priority,
        Belady,
    )
}
PREFETCH: dict[str, type[MemoryOps]] = {
    p.name: p
    for p in (PrefetchNone, DriverTree, AlwaysMax, AdaptiveSequential, TreeIter, Stride, PidTree, Priority)
}


class UnknownMemoryPolicy(UnknownPolicy):
    """An --evict or --prefetch name is not in the memory registries."""


def make_ops(evict: str = "default", prefetch: str = "tree") -> Composed:
    """A fresh ops table from an eviction and a prefetch policy name; unknown names list the known ones."""
    if evict not in EVICTION:
        raise UnknownMemoryPolicy(f"{evict!r} is not an eviction policy; known: {', '.join(EVICTION)}")
    if prefetch not in PREFETCH:
        raise UnknownMemoryPolicy(f"{prefetch!r} is not a prefetch policy; known: {', '.join(PREFETCH)}")
    return Composed(EVICTION[evict](), PREFETCH[prefetch]())
