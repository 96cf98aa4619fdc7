"""The unified-memory (UVM) model gpu_ext's hooks sit on: pages, VA blocks, root chunks, lists, prefetch tree.

Every number is the NVIDIA UVM driver's (open-gpu-kernel-modules ``kernel-open/nvidia-uvm``:
``uvm_perf_prefetch.c``, ``uvm_gpu_replayable_faults.c``, ``uvm_perf_thrashing.c``; gpu_ext's driver notes
describe the same lists), unless marked as ours; docs/references.md, "UVM driver":

- a page is 4 KB and is the leaf of the prefetch bitmap tree; a VA block is 2 MB = 512 pages, and the tree
  over one block has log2(512) + 1 = 10 levels;
- a faulted page grows to its 64 KB big page (16 pages) before the tree runs, unless the block thrashes;
- a VA block is backed by one 2 MB root chunk; eviction is always a whole root chunk; GPU capacity is a
  whole number of chunks;
- the driver's victim order is: a free chunk, else the head of ``unused``, else the head of ``used``; a chunk
  moves to the tail of ``used`` when it is activated (allocated or unpinned after a migration), never on a
  plain GPU access, so the native order is "least recently migrated-in";
- the native prefetcher picks, from the leaf up, the largest tree node whose resident-or-faulted count
  satisfies ``counter * 100 > pages * 51``; on a first-touch fault whose destination is the preferred
  location it takes the whole block; it never crosses a block; thrashing pages are left out;
- faults are fetched in batches of 256; a page thrashes at 3 events within a 500 µs lapse.

Shortcut (ours): thrashing is tracked per VA block, not per page. Eviction always takes a whole chunk, so
every page of a block shares the same eviction history and per-page tracking would give the same answer.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from gpuslice.units import KiB, MiB

__all__ = [
    "BIG_PAGE_PAGES",
    "CHUNK_BYTES",
    "FAULT_BATCH",
    "PAGES_PER_BLOCK",
    "PAGE_BYTES",
    "TREE_LEVELS",
    "TREE_THRESHOLD_PCT",
    "ChunkLists",
    "Thrashing",
    "ThrashingParams",
    "grow_to_big_pages",
    "native_prefetch_mask",
    "native_region",
    "tree_counts",
]

PAGE_BYTES = 4 * KiB  # CPU page and prefetch-tree leaf (uvm_perf_prefetch.c)
PAGES_PER_BLOCK = 512  # 2 MB VA block = 512 × 4 KB pages (PAGES_PER_UVM_VA_BLOCK); prefetch never crosses it
CHUNK_BYTES = 2 * MiB  # PMM root chunk, the unit of allocation and eviction (UVM_CHUNK_SIZE_MAX)
BIG_PAGE_PAGES = 16  # 64 KB GPU big page: a fault grows to it before the tree runs (uvm_perf_prefetch.c)
TREE_LEVELS = 10  # log2(roundup_pow2(512)) + 1 for a full block (uvm_perf_prefetch.c)
TREE_THRESHOLD_PCT = 51  # uvm_perf_prefetch_threshold default (uvm_perf_prefetch.c)
FAULT_BATCH = 256  # uvm_perf_fault_batch_count: faults fetched per batch (uvm_gpu_replayable_faults.c)

_BIG_OFFSETS = np.arange(BIG_PAGE_PAGES)[None, :]
_BLOCK_BYTES = PAGES_PER_BLOCK * PAGE_BYTES
assert _BLOCK_BYTES == CHUNK_BYTES  # one VA block is backed by exactly one root chunk


class ChunkLists:
    """The PMM's two eviction lists of root chunks (one chunk per VA block, so chunks are named by block).

    Head = evicted first, tail = evicted last (``pick_root_chunk_to_evict``). ``used`` holds chunks with
    resident pages, ``unused`` chunks that are allocated but hold nothing; a policy may move a chunk to either
    list. ``generation[block]`` changes when a chunk's list *state* changes, never on a move within a list
    (gpu_ext's v2 ``list_generation``), so a request made against an older state can be told apart.
    """

    USED = 1  # gpu_ext v2 destination codes (nv-gpu-transition-validator.h)
    UNUSED = 2

    def __init__(self) -> None:
        self.used: OrderedDict[int, None] = OrderedDict()
        self.unused: OrderedDict[int, None] = OrderedDict()
        self.generation: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.used) + len(self.unused)

    def __contains__(self, block: int) -> bool:
        return block in self.used or block in self.unused

    def list_of(self, block: int) -> int:
        """USED, UNUSED, or 0 when the block holds no chunk."""
        if block in self.used:
            return self.USED
        return self.UNUSED if block in self.unused else 0

    def activate(self, block: int) -> None:
        """The driver's own move at activation: to the TAIL of ``used`` (``block_activate``)."""
        if block in self.unused:
            del self.unused[block]
            self.generation[block] = self.generation.get(block, 0) + 1
        elif block not in self.used:
            self.generation[block] = self.generation.get(block, 0) + 1
        self.used[block] = None
        self.used.move_to_end(block)

    def move(self, block: int, destination: int, head: bool) -> None:
        """Commit a validated request: put ``block`` at the head or tail of ``destination``."""
        target, other = (self.used, self.unused) if destination == self.USED else (self.unused, self.used)
        if block in other:
            del other[block]
            self.generation[block] = self.generation.get(block, 0) + 1
        target[block] = None
        target.move_to_end(block, last=not head)

    def victim(self, pinned: int = -1) -> int:
        """The block whose chunk the driver evicts next: head of ``unused``, else head of ``used``.

        Free chunks come first in the driver's order but are not on a list: the caller checks them.
        ``pinned`` (the block being serviced) is skipped, as the driver skips pinned chunks.
        """
        for lst in (self.unused, self.used):
            for block in lst:
                if block != pinned:
                    return block
        raise LookupError("no evictable chunk")  # capacity >= 1 and the pinned block holds no chunk yet

    def remove(self, block: int) -> None:
        self.used.pop(block, None)
        self.unused.pop(block, None)
        self.generation[block] = self.generation.get(block, 0) + 1

    def head(self, destination: int, count: int) -> list[int]:
        """Up to ``count`` blocks from the head of one list, head first."""
        lst = self.used if destination == self.USED else self.unused
        out = []
        for block in lst:
            if len(out) == count:
                break
            out.append(block)
        return out


def grow_to_big_pages(pages: np.ndarray) -> np.ndarray:
    """Page indices of every 64 KB big page holding a faulted page (grow_fault_granularity)."""
    bigs = np.unique(np.asarray(pages) // BIG_PAGE_PAGES)
    return (bigs[:, None] * BIG_PAGE_PAGES + _BIG_OFFSETS).ravel()


def tree_counts(resident: np.ndarray, pages: np.ndarray, grow: bool = True) -> list[int]:
    """Prefix sums of the block's occupied pages (resident, or faulted grown to 64 KB unless ``grow`` is
    off): the bitmap-tree counter of any node ``[first, outer)`` is ``cs[outer] - cs[first]``."""
    occupied = resident.copy()
    occupied[grow_to_big_pages(pages) if grow else pages] = True
    return [0, *np.cumsum(occupied).tolist()]


def native_region(cs: list[int], page: int, threshold_pct: int = TREE_THRESHOLD_PCT) -> tuple[int, int]:
    """The largest tree node holding ``page`` with ``counter * 100 > pages * threshold`` (the driver's),
    searched from the root down; the leaf always qualifies, since a faulted page counts as occupied."""
    for k in range(TREE_LEVELS - 1, -1, -1):
        first = (page >> k) << k
        outer = first + (1 << k)
        if (cs[outer] - cs[first]) * 100 > (1 << k) * threshold_pct:
            return first, outer
    return page, page + 1


def native_prefetch_mask(
    resident: np.ndarray,
    pages: np.ndarray,
    threshold_pct: int = TREE_THRESHOLD_PCT,
    whole_block_on_first_touch: bool = False,
    thrashing: bool = False,
) -> np.ndarray:
    """Pages the native driver migrates for one VA block's faulted ``pages``: the faulted pages plus, for
    each, the largest qualifying tree node (the driver's default prefetch). The union over faulted pages
    of their largest nodes is what the per-page loop of compute_prefetch_region produces.

    On a first touch (nothing resident) with ``whole_block_on_first_touch`` the whole block is returned;
    the driver does that only when the destination is the preferred location, which plain managed memory
    (no cudaMemAdvise) does not set. A thrashing block gets only its faulted pages (thrashing pages are
    excluded from prefetch and from big-page growth).
    """
    out = np.zeros(PAGES_PER_BLOCK, dtype=bool)
    out[pages] = True
    if thrashing:
        return out
    if whole_block_on_first_touch and not resident.any():
        out[:] = True
        return out
    bigs = sorted({p // BIG_PAGE_PAGES for p in np.asarray(pages).tolist()})
    occupied = resident.copy()
    for big in bigs:
        occupied[big * BIG_PAGE_PAGES : (big + 1) * BIG_PAGE_PAGES] = True
    cs = [0, *np.cumsum(occupied).tolist()]
    covered = -1
    for page in (big * BIG_PAGE_PAGES for big in bigs):
        if page < covered:
            continue  # inside the node an earlier faulted page already chose
        first, outer = native_region(cs, page, threshold_pct)
        out[first:outer] = True
        covered = outer
    return out


@dataclass(frozen=True)
class ThrashingParams:
    """uvm_perf_thrashing defaults of the current NVIDIA source (uvm_perf_thrashing.c)."""

    threshold: int = 3  # events before a page counts as thrashing
    lapse_s: float = 500e-6  # a refault within this long after an eviction is an event
    epoch_s: float = 2000 * 500e-6  # epoch = 2000 × lapse: the counts reset after it


class Thrashing:
    """Per-block thrashing detection: a refault within ``lapse`` of the block's eviction is an event; at
    ``threshold`` events in one epoch the block is thrashing until the epoch ends.

    Shortcut (ours): the driver's mitigations (throttle the CPU, pin the page after 10 events) are not
    modelled; detection only removes the block's pages from native prefetch (as uvm_perf_prefetch.c does).
    """

    def __init__(self, blocks: int, params: ThrashingParams | None = None) -> None:
        self.params = params or ThrashingParams()
        # plain lists: read and written one block at a time from Python, where numpy scalars are slower
        self.evicted_at = [-math.inf] * blocks
        self.events = [0] * blocks
        self.epoch_start = [0.0] * blocks
        self.total_events = 0

    def on_evict(self, block: int, now_s: float) -> None:
        self.evicted_at[block] = now_s

    def on_fault_in(self, block: int, now_s: float) -> bool:
        """Record a chunk coming back; return whether the block is now thrashing."""
        p = self.params
        if now_s - self.epoch_start[block] > p.epoch_s:
            self.events[block] = 0
            self.epoch_start[block] = now_s
        if now_s - self.evicted_at[block] < p.lapse_s:
            self.events[block] += 1
            self.total_events += 1
        return self.events[block] >= p.threshold

    def is_thrashing(self, block: int, now_s: float) -> bool:
        p = self.params
        return self.events[block] >= p.threshold and now_s - self.epoch_start[block] <= p.epoch_s
