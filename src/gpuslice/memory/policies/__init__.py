"""Memory policies, one per file, and their registries (names are the CLI's ``--evict``/``--prefetch``).

| eviction     | rule                                              | source (docs/references.md)         |
|--------------|---------------------------------------------------|-------------------------------------|
| default      | driver LRU at activation                          | UVM driver, ``uvm_pmm_gpu.c``       |
| fifo         | order of activation, accesses never move          | gpu_ext ``eviction_fifo.bpf.c``     |
| lfu          | new chunk at head, access → freq+1 and tail       | gpu_ext ``eviction_lfu.bpf.c``      |
| mru          | new at tail, used → head (FIFO without hits)      | gpu_ext ``eviction_mru.bpf.c``      |
| mru-textbook | textbook MRU: new or used → head                  | Chou and DeWitt, VLDB 1985          |
| freq-decay   | tail every N-th access, N per tenant              | gpu_ext ``eviction_freq_pid_decay`` |
| fifo-chance  | second chances per tenant at evict-prepare        | gpu_ext ``eviction_fifo_chance``    |
| pid-quota    | tenants over quota are not protected              | gpu_ext ``eviction_pid_quota``      |
| 2q           | probation at head until seen in two episodes      | gpu_ext ``eviction_2q_approx``      |
| priority     | freq-decay half of the per-tenant priority policy | gpu_ext ``prefetch_eviction_pid``   |
| belady       | offline MIN (the bound)                           | Belady, IBM Systems Journal 1966    |

gpu_ext policies are the ``extension/*.bpf.c`` files of eunomia-bpf/gpu_ext (docs/references.md).
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
from gpuslice.registry import Registry

__all__ = ["DEFAULT_EVICTION", "DEFAULT_PREFETCH", "EVICTION", "PREFETCH", "UnknownMemoryPolicy", "make_ops"]


class UnknownMemoryPolicy(UnknownPolicy):
    """An --evict or --prefetch name is not in the memory registries."""


# The driver's own policy first in each, so "known: ..." messages and `memsim --compare` start with it.
EVICTION: Registry[MemoryOps] = Registry(
    "eviction",
    (DriverDefault, Fifo, Lfu, Mru, MruTextbook, FreqDecay, FifoChance, PidQuota, TwoQ, Priority, Belady),
    error=UnknownMemoryPolicy,
)
PREFETCH: Registry[MemoryOps] = Registry(
    "prefetch",
    (PrefetchNone, DriverTree, AlwaysMax, AdaptiveSequential, TreeIter, Stride, PidTree, Priority),
    error=UnknownMemoryPolicy,
)


# What memsim and a memory policy file's guard fall back to: the NVIDIA driver's own behaviour.
DEFAULT_EVICTION = DriverDefault.name
DEFAULT_PREFETCH = DriverTree.name


def make_ops(evict: str = DEFAULT_EVICTION, prefetch: str = DEFAULT_PREFETCH) -> Composed:
    """A fresh ops table from an eviction and a prefetch policy name; unknown names list the known ones."""
    evict_cls, prefetch_cls = EVICTION.lookup(evict), PREFETCH.lookup(prefetch)
    return Composed(evict_cls(), prefetch_cls())
