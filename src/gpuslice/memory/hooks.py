"""The memory ops table (gpu_ext's ``gpu_mem_ops``) and the decision context that validates its advice.

Lifecycle of one fault batch, as the simulator runs it (gpu_ext's ``uvm_bpf_struct_ops.c`` has the driver's):

```text
hits between batches ──("full" visibility only)──► block_access(view, block, hits, ctx)  per block
batch of ≤ 256 faults, per VA block in address order:
    no chunk yet? ── capacity full? ──► evict_prepare(view, evict_ctx) ──► victim: unused head | used head
    page_prefetch(view, fault, ctx)        per faulted page: DEFAULT | BYPASS | ENTER_LOOP
        ENTER_LOOP ──► page_prefetch_iter(view, fault, first, outer, counter, ctx)   per tree level, leaf→root
    migrate faulted ∪ prefetched pages ──► driver moves the chunk to the used TAIL
    block_activate(view, block, ctx)
```

Every hook is optional; the base class is the driver. A policy only *requests*
(``ctx.request_reorder(destination, position)``, ``ctx.set_prefetch_region(first, outer)``); the mechanism
validates the request after the callback returns, like gpu_ext's v2 transaction ABI
(``nv-gpu-transition-validator.h``): the first request wins, an identical repeat is a no-op, a different
second request cancels both (conflict), and out-of-range values are rejected. Every outcome is counted under a
``RESULT_*`` code, so bad advice costs quality, never correctness.

Visibility: with ``"driver"`` (default) ``block_access`` never fires, as on real workloads ("the latter is
never called", gpu_ext extension/README.md); with ``"full"`` it fires once per resident block touched between
two fault batches, with the number of hits — our stand-in for the populate path gpu_ext's LFU was written for.

Departure from v2 (ours): ``evict_prepare`` gets a context that may *move* up to 8 chunks (the v0/v1
``block_move_head/tail`` kfuncs), because FIFO-chance needs it (``eviction_fifo_chance.bpf.c``) and the
offline Belady bound needs to name its victim. Moves are validated like requests (the chunk must be on a list,
codes in range).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

if TYPE_CHECKING:
    from gpuslice.memory.uvm import ChunkLists

__all__ = [
    "BYPASS",
    "DEFAULT",
    "ENTER_LOOP",
    "EVICT_MOVES_MAX",
    "HEAD",
    "PRIORITY_HIGH",
    "PRIORITY_LOW",
    "PRIORITY_OTHER",
    "RESULT_CODES",
    "TAIL",
    "UNUSED",
    "USED",
    "VISIBILITIES",
    "Composed",
    "DecisionContext",
    "EvictContext",
    "MemoryOps",
    "MemoryView",
    "PrefetchFault",
]

# Return codes of block_access / page_prefetch (gpu_ext uvm_bpf_struct_ops.h).
DEFAULT = 0
BYPASS = 1
ENTER_LOOP = 2
# request_reorder codes: destination USED=1 / UNUSED=2, position HEAD=1 / TAIL=2 (gpu_ext v2 ABI).
USED = 1
UNUSED = 2
HEAD = 1
TAIL = 2
EVICT_MOVES_MAX = (
    8  # FIFO-chance examines at most 8 head chunks (eviction_fifo_chance.bpf.c); the evict ctx allows as many
)
# v2 result codes (gpu_ext v2 ABI); REJECT_IDENTITY is used by evict moves naming a chunk on no list.
RESULT_CODES = (
    "APPLY",
    "NOOP_DEFAULT",
    "NOOP_REPEAT",
    "NOOP_CONFLICT",
    "REJECT_ACTION",
    "REJECT_RANGE",
    "REJECT_IDENTITY",
)
VISIBILITIES = ("driver", "full")
# Tenant priority classes of gpu_ext's shared config ARRAY: key 0/1 high PID/param, 2/3 low, 4 others
# (eviction_common.h).
PRIORITY_HIGH = "high"
PRIORITY_LOW = "low"
PRIORITY_OTHER = "other"

_REORDER = "reorder"
_REGION = "region"


class DecisionContext:
    """One callback's request slot (gpu_ext v2 ``decision_ctx``). ``kind`` is "reorder" or "region"."""

    __slots__ = ("_conflict", "_kind", "_request")

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._request: tuple[str, int, int] | None = None
        self._conflict = False

    def _record(self, request: tuple[str, int, int]) -> None:
        if self._request is None:
            self._request = request
        elif self._request != request:
            self._conflict = True  # a different second request cancels both (gpu_ext v2 rule)

    def request_reorder(self, destination: int, position: int) -> None:
        """Ask for the chunk to go to USED/UNUSED × HEAD/TAIL; applied after the callback if valid."""
        self._record((_REORDER, int(destination), int(position)))

    def set_prefetch_region(self, first: int, outer: int) -> None:
        """Ask to prefetch pages ``[first, outer)`` of the faulting block; (0, 0) means "nothing"."""
        self._record((_REGION, int(first), int(outer)))

    def commit(self, max_first: int = 0, max_outer: int = 512) -> tuple[str, tuple[int, int] | None]:
        """Validate after the callback: (result code, (a, b) to apply or None). Called by the mechanism."""
        if self._request is None:
            return "NOOP_DEFAULT", None
        if self._conflict:
            return "NOOP_CONFLICT", None
        kind, a, b = self._request
        if kind != self._kind:
            return "REJECT_ACTION", None
        if kind == _REORDER:
            if a not in (USED, UNUSED) or b not in (HEAD, TAIL):
                return "REJECT_RANGE", None
        elif (a, b) != (0, 0) and not (max_first <= a < b <= max_outer):
            return "REJECT_RANGE", None  # must satisfy first < outer inside max_prefetch_region (gpu_ext v2)
        return "APPLY", (a, b)


class EvictContext:
    """evict_prepare's move list (v0/v1 block_move_head/tail semantics; see the module docstring)."""

    __slots__ = ("moves",)

    def __init__(self) -> None:
        self.moves: list[tuple[int, int, int]] = []

    def move(self, block: int, destination: int, position: int) -> None:
        """Ask to move ``block``'s chunk to HEAD/TAIL of USED/UNUSED; at most 8 moves, applied in order."""
        self.moves.append((int(block), int(destination), int(position)))

    def commit(self, lists: ChunkLists, counts: dict[str, int]) -> None:
        for i, (block, destination, position) in enumerate(self.moves):
            if i >= EVICT_MOVES_MAX or destination not in (USED, UNUSED) or position not in (HEAD, TAIL):
                counts["REJECT_RANGE"] += 1
            elif block not in lists:
                counts["REJECT_IDENTITY"] += 1
            else:
                lists.move(block, destination, position == HEAD)
                counts["APPLY"] += 1


class PrefetchFault:
    """What page_prefetch sees about one faulted page (gpu_ext's bitmap tree and max region).

    ``block`` and ``tenant`` are given directly; gpu_ext recovers them with a kprobe
    (on ``uvm_perf_prefetch_get_hint_va_block``).
    ``resident`` is the block's 512-long residency mask before this batch (read-only);
    ``occupied(first, outer)`` is the bitmap tree's counter for that node (resident or faulted pages,
    faulted ones grown to 64 KB).
    """

    __slots__ = ("_cs", "block", "max_first", "max_outer", "page_index", "resident", "tenant")

    def __init__(self, block: int, page_index: int, tenant: int, resident: np.ndarray, cs: list[int]) -> None:
        self.block = block
        self.page_index = page_index
        self.tenant = tenant
        self.resident = resident
        self._cs = cs
        self.max_first = 0  # max_prefetch_region is always the current VA block (gpu_ext)
        self.max_outer = 512

    def occupied(self, first: int, outer: int) -> int:
        """Occupied pages in ``[first, outer)`` (clamped to the block)."""
        first, outer = max(0, first), min(512, outer)
        return self._cs[outer] - self._cs[first] if outer > first else 0


class MemoryView:
    """Read-only state a hook may look at; the simulator moves ``position`` and ``now_s`` forward.

    ``owner[block]`` is the tenant owning each VA block; ``now_s`` the simulated clock; ``moved_bytes``
    the link traffic so far; ``trace_blocks`` is the whole trace's block column
    (only the offline Belady bound reads it); ``position`` is the index of the first access after the
    batch being serviced.
    """

    def __init__(
        self,
        owner: np.ndarray,
        trace_blocks: np.ndarray,
        capacity_chunks: int,
        lists: ChunkLists,
        resident_pages: np.ndarray,
        priorities: dict[int, str],
    ) -> None:
        self.owner = owner.view()
        self.owner.flags.writeable = False
        self.trace_blocks = trace_blocks.view()
        self.trace_blocks.flags.writeable = False
        self.capacity_chunks = capacity_chunks
        self._lists = lists
        self._resident_pages = resident_pages
        self._priorities = priorities
        self.position = 0
        self.now_s = 0.0
        self.moved_bytes = 0  # bytes moved over the link so far (in and out)

    def priority(self, tenant: int) -> str:
        """PRIORITY_HIGH / PRIORITY_LOW / PRIORITY_OTHER for a tenant (gpu_ext ``eviction_common.h``)."""
        return self._priorities.get(int(tenant), PRIORITY_OTHER)

    def list_of(self, block: int) -> int:
        """USED, UNUSED, or 0 when the block holds no chunk."""
        return self._lists.list_of(block)

    def head(self, destination: int, count: int) -> list[int]:
        """Up to ``count`` blocks at the head (next victims) of USED or UNUSED."""
        return self._lists.head(destination, count)

    def resident_blocks(self) -> list[int]:
        """Every block holding a chunk, unused list first, each list head first."""
        return self.head(UNUSED, len(self._lists)) + self.head(USED, len(self._lists))

    def resident_page_count(self, block: int) -> int:
        return int(self._resident_pages[block])


class MemoryOps:
    """Base ops table: every hook is optional and this class *is* the driver's behaviour.

    Subclasses set ``name`` and a one-line ``summary``; ``kind`` says which half they implement
    ("evict", "prefetch" or "both"), which the registry and ``Composed`` use.
    """

    name: ClassVar[str] = "driver"
    summary: ClassVar[str] = "the driver: LRU at activation, 51 % tree prefetcher"
    kind: ClassVar[str] = "both"

    def init(self, view: MemoryView) -> None:
        """Once, before the first access. Default: nothing."""

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        """After the driver moved ``block``'s chunk to the used TAIL (allocation or migration into it).
        Return value ignored; one valid ``request_reorder`` is applied. Default: keep the tail."""

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        """``hits`` accesses to resident ``block`` since the last batch ("full" visibility only).
        DEFAULT with no request: the native move to the used TAIL; BYPASS with no request: no move; a valid
        request with either: that request instead. Default: DEFAULT."""
        return DEFAULT

    def evict_prepare(self, view: MemoryView, ctx: EvictContext) -> None:
        """Before a victim is taken from a list head; may move up to 8 chunks. Default: nothing."""

    def page_prefetch(self, view: MemoryView, fault: PrefetchFault, ctx: DecisionContext) -> int:
        """Per faulted page: DEFAULT = native 51 % tree; BYPASS = the requested region (native if none or
        invalid); ENTER_LOOP = ask page_prefetch_iter at every tree level. Default: DEFAULT."""
        return DEFAULT

    def page_prefetch_iter(
        self,
        view: MemoryView,
        fault: PrefetchFault,
        first: int,
        outer: int,
        counter: int,
        ctx: DecisionContext,
    ) -> int:
        """Per tree level, leaf to root: node ``[first, outer)`` holds ``counter`` occupied pages. Return 1
        with a valid region to commit it (later commits overwrite earlier ones); 0 to skip. Default: 0."""
        return 0


class Composed(MemoryOps):
    """One ops table from an eviction half and a prefetch half (gpu_ext attaches one struct_ops at a time)."""

    kind = "both"

    def __init__(self, evict: MemoryOps, prefetch: MemoryOps) -> None:
        self.evict, self.prefetch = evict, prefetch
        self.name = f"{evict.name}+{prefetch.name}"  # type: ignore[misc]

    def init(self, view: MemoryView) -> None:
        self.evict.init(view)
        if self.prefetch is not self.evict:
            self.prefetch.init(view)

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        self.evict.block_activate(view, block, ctx)

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        return self.evict.block_access(view, block, hits, ctx)

    def evict_prepare(self, view: MemoryView, ctx: EvictContext) -> None:
        self.evict.evict_prepare(view, ctx)

    def page_prefetch(self, view: MemoryView, fault: PrefetchFault, ctx: DecisionContext) -> int:
        return self.prefetch.page_prefetch(view, fault, ctx)

    def page_prefetch_iter(
        self,
        view: MemoryView,
        fault: PrefetchFault,
        first: int,
        outer: int,
        counter: int,
        ctx: DecisionContext,
    ) -> int:
        return self.prefetch.page_prefetch_iter(view, fault, first, outer, counter, ctx)
