"""Servicing one batch of faults in the UVM model: evict, prefetch, migrate, activate, with the hooks.

``FaultService`` holds the state of one replay (residency bitmap, chunk lists, thrashing detector,
counters, clock) and services each batch of faulted pages the replay loops in ``simulator`` hand it.
Hooks are called exactly where gpu_ext's driver calls them: ``block_activate`` after the driver's own
tail move, ``evict_prepare`` before the victim is taken from the list head, ``page_prefetch`` (and
``_iter``) per faulted page of a block, ``block_access`` on hits when visibility is "full". A hook left
to the driver is not called at all (``overrides``), so a driver-only table runs the native code paths.

Driver behaviour followed here (NVIDIA open-gpu-kernel-modules, ``nvidia-uvm``): a faulted 4 KB page is
first grown to its 64 KB big page, then the prefetch tree takes the largest node that is more than 51 %
resident or faulted (``uvm_perf_prefetch.c``); thrashing pages are excluded from prefetch; the per-page
prefetch loop stops once the region reaches the end of the 2 MB block; eviction takes a whole 2 MB root
chunk from the head of the used list (``uvm_pmm_gpu.c``). Sources: docs/references.md.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from gpuslice.memory.hooks import (
    BYPASS,
    DEFAULT,
    ENTER_LOOP,
    PRIORITY_HIGH,
    PRIORITY_LOW,
    RESULT_CODES,
    VISIBILITIES,
    Composed,
    DecisionContext,
    EvictContext,
    MemoryOps,
    MemoryView,
    PrefetchFault,
)
from gpuslice.memory.uvm import (
    BIG_PAGE_PAGES,
    FAULT_BATCH,
    PAGE_BYTES,
    PAGES_PER_BLOCK,
    TREE_LEVELS,
    TREE_THRESHOLD_PCT,
    ChunkLists,
    Thrashing,
    native_prefetch_mask,
    native_region,
    tree_counts,
)
from gpuslice.memory.workloads import Trace

if TYPE_CHECKING:
    from gpuslice.memory.simulator import SimConfig

__all__ = ["FaultService", "overrides"]

_P = PAGES_PER_BLOCK
_NO = np.zeros(FAULT_BATCH, dtype=bool)  # no first-touch rows (a batch spans at most 256 blocks)


def _default_priorities(trace: Trace) -> dict[int, str]:
    return {0: PRIORITY_HIGH, 1: PRIORITY_LOW} if trace.tenants > 1 else {}


def overrides(ops: MemoryOps, hook: str) -> bool:
    """Whether ``ops`` (or the half of a Composed that owns ``hook``) replaces the driver's hook; the
    simulator skips calling hooks that would do exactly what the driver does."""
    if isinstance(ops, Composed):
        ops = ops.prefetch if hook.startswith("page_prefetch") else ops.evict
    return getattr(type(ops), hook) is not getattr(MemoryOps, hook)


def _tree_above_big_pages() -> tuple[np.ndarray, np.ndarray]:
    """(32 big pages × 31 nodes) membership of the tree levels above the 64 KB big page (128 KB … 2 MB),
    and each node's size in big pages."""
    nbig = _P // BIG_PAGE_PAGES
    cols, sizes = [], []
    span = 2
    while span <= nbig:
        for first in range(0, nbig, span):
            col = np.zeros(nbig)
            col[first : first + span] = 1.0
            cols.append(col)
            sizes.append(span)
        span *= 2
    return np.stack(cols, axis=1), np.array(sizes, dtype=float)


_TREE, _TREE_SIZES = _tree_above_big_pages()
_TREE_LIMIT = _TREE_SIZES * BIG_PAGE_PAGES * TREE_THRESHOLD_PCT / 100  # a node qualifies above this count


def _native_masks(
    rows: np.ndarray, faulted: np.ndarray, thr: np.ndarray, first_touch: np.ndarray
) -> np.ndarray:
    """The native prefetcher for every block of a batch at once (``uvm.native_prefetch_mask`` per row).

    A faulted page's region is its largest tree node with ``counter * 100 > pages * 51``; tree nodes nest,
    so the union over faulted pages is the union of the qualifying nodes that hold a faulted page. Every
    faulted page grows to its 64 KB big page first, so nodes up to the big page always qualify, and the
    31 nodes above it are counted with one product of (blocks × 32) big-page counts by the membership
    matrix. Thrashing rows get their faulted pages only; first-touch rows the whole block.
    """
    k, nbig = len(rows), _P // BIG_PAGE_PAGES
    fault = faulted.reshape(k, nbig, BIG_PAGE_PAGES).any(axis=2)
    count = np.where(fault, BIG_PAGE_PAGES, rows.reshape(k, nbig, BIG_PAGE_PAGES).sum(axis=2))
    pick = ((count @ _TREE) > _TREE_LIMIT) & ((fault @ _TREE) > 0)
    chosen = fault | ((pick @ _TREE.T) > 0)
    mask = np.repeat(chosen, BIG_PAGE_PAGES, axis=1)
    mask[first_touch] = True
    mask[thr] = faulted[thr]
    return mask


class FaultService:
    """State of one replay and the service of its fault batches; ``simulator._Run`` adds the replay loops."""

    def __init__(
        self, trace: Trace, ops: MemoryOps, config: SimConfig, capacity: int, vectorised: bool = True
    ) -> None:
        if config.visibility not in VISIBILITIES:
            raise ValueError(f"visibility must be one of {VISIBILITIES}")
        self.trace, self.ops, self.cfg = trace, ops, config
        self.capacity = capacity
        nb = trace.blocks
        self.resident = np.zeros(nb * _P, dtype=bool)
        self.res_count = np.zeros(nb, dtype=np.int64)
        self.lists = ChunkLists()
        self.service = self._service_batch if vectorised else self._service_batch_reference
        self.thrash = Thrashing(nb, config.thrashing)
        priorities = config.priorities if config.priorities is not None else _default_priorities(trace)
        self.view = MemoryView(
            trace.owner, trace.block, self.capacity, self.lists, self.res_count, priorities
        )
        self.counts: Counter[str] = Counter({code: 0 for code in RESULT_CODES})
        self.native = not overrides(ops, "page_prefetch")
        self.hook_activate = overrides(ops, "block_activate")
        self.hook_evict = overrides(ops, "evict_prepare")
        self.faults = self.chunk_faults = self.batches = self.evictions = 0
        self.migrated_pages = self.evicted_pages = 0
        # clock = compute of the accesses issued so far + service time of the batches so far; set from the
        # two sums (not accumulated step by step) so that every replay path gets the same float bits
        self.clock = self.service_s = 0.0
        tenants = max(1, trace.tenants)
        self.tenant_s = np.zeros(tenants)
        self.tenant_bytes = np.zeros(tenants)
        self.gp = np.zeros(0, dtype=np.int64)  # global page of every trace row; the replay loop sets it

    # -- eviction -----------------------------------------------------------------------------------
    def _evict_victim(self, pinned: int) -> int:
        """evict_prepare (if overridden), then take the driver's victim off the lists; pages are the
        caller's to count and clear."""
        if self.hook_evict:
            ectx = EvictContext()
            self.ops.evict_prepare(self.view, ectx)
            ectx.commit(self.lists, self.counts)
        victim = self.lists.victim(pinned)
        self.lists.remove(victim)
        self.evictions += 1
        self.thrash.on_evict(victim, self.clock)
        return victim

    def _evict_one(self, pinned: int) -> int:
        victim = self._evict_victim(pinned)
        self.resident[victim * _P : (victim + 1) * _P] = False
        pages = int(self.res_count[victim])
        self.res_count[victim] = 0
        self.evicted_pages += pages
        return pages

    # -- prefetch -----------------------------------------------------------------------------------
    def _hook_region(
        self, block: int, pages: list[int], ro: np.ndarray, cs: list[int], thrashing: bool, first_touch: bool
    ) -> np.ndarray:
        """Python page_prefetch (and _iter) per faulted page of one block; the mask it migrates."""
        tenant = int(self.trace.owner[block])
        out = np.zeros(_P, dtype=bool)
        out[pages] = True
        for page in pages:
            fault = PrefetchFault(block, page, tenant, ro, cs)
            ctx = DecisionContext("region")
            action = self.ops.page_prefetch(self.view, fault, ctx)
            region = None
            if action == BYPASS:
                code, region = ctx.commit()
                self.counts[code] += 1
            elif action == ENTER_LOOP:
                region = self._iterate(fault, ctx, cs)
            elif action != DEFAULT:
                self.counts["REJECT_ACTION"] += 1
            if region is None:  # DEFAULT, or a missing or invalid request: the native heuristic
                if thrashing:
                    region = (page, page + 1)  # thrashing pages are excluded from native prefetch
                elif first_touch:
                    region = (0, _P)
                else:
                    region = native_region(cs, page)
            first, outer = region
            out[first:outer] = True
            if outer >= _P:
                break  # the driver stops once the region reaches the end of the block
        return out

    def _prefetch_mask(
        self, block: int, pages: np.ndarray, resident: np.ndarray, thrashing: bool
    ) -> np.ndarray:
        """Reference path (``vectorised=False``): one block at a time."""
        first_touch = self.cfg.preferred_gpu and self.res_count[block] == 0
        if self.native:
            return native_prefetch_mask(resident, pages, TREE_THRESHOLD_PCT, first_touch, thrashing)
        cs = tree_counts(resident, pages, grow=not thrashing)
        ro = resident.copy()
        ro.flags.writeable = False
        return self._hook_region(block, pages.tolist(), ro, cs, thrashing, first_touch)

    def _iterate(self, fault: PrefetchFault, ctx: DecisionContext, cs: list[int]) -> tuple[int, int] | None:
        """ENTER_LOOP: page_prefetch_iter at every tree level, leaf to root; the last valid commit wins."""
        code, region = ctx.commit()  # the initial request, usually the empty region
        if code != "NOOP_DEFAULT":
            self.counts[code] += 1
        page = fault.page_index
        for k in range(TREE_LEVELS):
            first = (page >> k) << k
            outer = first + (1 << k)
            ictx = DecisionContext("region")
            r = self.ops.page_prefetch_iter(self.view, fault, first, outer, cs[outer] - cs[first], ictx)
            if r == 1:
                code, value = ictx.commit()
                self.counts[code] += 1
                region = value if value is not None else region
            elif r != 0:
                self.counts["REJECT_ACTION"] += 1
        return region

    # -- service ------------------------------------------------------------------------------------
    def _activate(self, block: int) -> None:
        self.lists.activate(block)  # the driver's own tail move comes first (gpu_ext's block_activate)
        if not self.hook_activate:
            return
        ctx = DecisionContext("reorder")
        self.ops.block_activate(self.view, block, ctx)
        self._apply(block, ctx)

    def _apply(self, block: int, ctx: DecisionContext) -> bool:
        code, value = ctx.commit()
        if code != "NOOP_DEFAULT":
            self.counts[code] += 1
        if value is not None:
            self.lists.move(block, value[0], value[1] == 1)
            return True
        return False

    def _charge(self, moved_in: np.ndarray, moved_out: np.ndarray, waiting: set[int] | list[int]) -> None:
        self.batches += 1
        moved = int(moved_in.sum() + moved_out.sum())
        self.migrated_pages += int(moved_in.sum())
        self.evicted_pages += int(moved_out.sum())
        self.service_s += self.cfg.cost.batch_seconds(moved * PAGE_BYTES)
        self.view.moved_bytes += moved * PAGE_BYTES
        for t in waiting:
            self.tenant_s[t] += self.cfg.cost.batch_overhead_s
        self.tenant_s += (moved_in + moved_out) * PAGE_BYTES / self.cfg.cost.link_bytes_per_s

    def _service_batch_reference(self, gpages: np.ndarray) -> None:
        """One block at a time, in address order: evict, prefetch, migrate, activate. Kept as the
        readable specification the vectorised ``_service_batch`` is tested against."""
        owner = self.trace.owner
        blocks = gpages // _P
        cuts = [0, *(np.flatnonzero(blocks[1:] != blocks[:-1]) + 1).tolist(), len(gpages)]
        moved_in = np.zeros_like(self.tenant_bytes)
        moved_out = np.zeros_like(self.tenant_bytes)
        waiting = set()
        for a, b in itertools.pairwise(cuts):
            block = int(blocks[a])
            tenant = int(owner[block])
            waiting.add(tenant)
            if block not in self.lists:
                self.chunk_faults += 1
                if len(self.lists) >= self.capacity:
                    moved_out[tenant] += self._evict_one(block)
                thrashing = self.thrash.on_fault_in(block, self.clock)
            else:
                thrashing = self.thrash.is_thrashing(block, self.clock)
            span = self.resident[block * _P : (block + 1) * _P]
            mask = self._prefetch_mask(block, gpages[a:b] - block * _P, span, thrashing)
            span |= mask
            new = int(np.count_nonzero(span)) - int(self.res_count[block])
            self.res_count[block] += new
            moved_in[tenant] += new
            self._activate(block)
        self.evicted_pages -= int(moved_out.sum())  # _evict_one counted them already; _charge does
        self._charge(moved_in, moved_out, waiting)

    def _service_batch(self, gpages: np.ndarray) -> None:
        """The same batch as ``_service_batch_reference``, in three passes so that only list and hook
        work runs per block in Python:

        1. per block in address order: chunk fault → evict (hooks) → thrashing check → activate (hooks);
           victims are recorded with the batch position at which they went;
        2. all blocks at once: the residency each block had when it was serviced (none if it was
           evicted earlier in the batch), the native tree over a (blocks × 512) matrix — or the Python
           prefetch hooks per faulted page — and the pages migrated;
        3. victims' pages: a victim evicted after its own service in this batch loses what it got.
        """
        lists, thrash, clock = self.lists, self.thrash, self.clock
        bidx = gpages // _P
        step = bidx[1:] != bidx[:-1]  # gpages are sorted
        ublocks = bidx[np.flatnonzero(step) + 1] if step.any() else bidx[:0]
        ublocks = np.concatenate((bidx[:1], ublocks))
        blist = ublocks.tolist()
        k = len(blist)
        chunk_fault = [False] * k
        thr = [False] * k
        victims: list[tuple[int, int]] = []  # (victim, batch position of the block that evicted it)
        for i, block in enumerate(blist):
            if block not in lists:
                self.chunk_faults += 1
                chunk_fault[i] = True
                if len(lists) >= self.capacity:
                    victims.append((self._evict_victim(block), i))
                thr[i] = thrash.on_fault_in(block, clock)
            else:
                thr[i] = thrash.is_thrashing(block, clock)
            self._activate(block)
        pos = dict(zip(blist, range(k), strict=True)) if victims else {}
        # residency at service time: a chunk fault starts empty (never resident, or evicted before now)
        res2d = self.resident.reshape(-1, _P)
        rows = res2d[ublocks]
        cf = np.array(chunk_fault)
        rows[cf] = False
        faulted = np.zeros((k, _P), dtype=bool)
        row_of = np.zeros(len(bidx), dtype=np.int64)
        np.cumsum(step, out=row_of[1:])
        faulted[row_of, gpages - bidx * _P] = True
        thr_arr = np.array(thr)
        first_touch = ~rows.any(axis=1) if self.cfg.preferred_gpu else _NO[:k]
        if self.native:
            mask = _native_masks(rows, faulted, thr_arr, first_touch)
        else:
            mask = self._hook_masks(blist, rows, faulted, thr_arr, first_touch)
        after = rows | mask
        after_count = np.count_nonzero(after, axis=1)
        new = after_count - np.count_nonzero(rows, axis=1)
        nt = len(self.tenant_bytes)
        if nt == 1:
            tenants = [0]
            moved_in = np.array([float(new.sum())])
        else:
            towner = self.trace.owner[ublocks]
            tenants = sorted(set(towner.tolist()))
            moved_in = np.bincount(towner, weights=new, minlength=nt).astype(float)
        moved_out = np.zeros(nt)
        if victims:  # pages leave with their chunk; charged to the tenant whose fault evicted it
            vic = np.array([v for v, _ in victims])
            at = np.array([a for _, a in victims])
            served = np.array([pos.get(v, k) for v, _ in victims])
            late = served < at  # serviced earlier in this batch, then evicted: it loses what it got
            by = self.trace.owner[ublocks[at]]
            early = vic[~late]
            moved_out += np.bincount(by[~late], weights=self.res_count[early], minlength=nt)
            res2d[early] = False
            self.res_count[early] = 0
        res2d[ublocks] = after
        self.res_count[ublocks] = after_count
        if victims and late.any():
            gone = vic[late]
            moved_out += np.bincount(by[late], weights=after_count[served[late]], minlength=nt)
            res2d[gone] = False
            self.res_count[gone] = 0
        self._charge(moved_in, moved_out, tenants)

    def _hook_masks(
        self,
        blist: list[int],
        rows: np.ndarray,
        faulted: np.ndarray,
        thr: np.ndarray,
        first_touch: np.ndarray,
    ) -> np.ndarray:
        """The Python prefetch hooks, per block of the batch, over the residency it had at service."""
        big = faulted.reshape(-1, _P // BIG_PAGE_PAGES, BIG_PAGE_PAGES).any(axis=2)
        grown = np.repeat(big, BIG_PAGE_PAGES, axis=1)
        occ = rows | np.where(thr[:, None], faulted, grown)
        cs = np.zeros((len(blist), _P + 1), dtype=np.int64)
        np.cumsum(occ, axis=1, out=cs[:, 1:])
        ro_rows = rows.copy()
        ro_rows.flags.writeable = False
        mask = np.empty_like(rows)
        for i, block in enumerate(blist):
            pages = np.flatnonzero(faulted[i]).tolist()
            mask[i] = self._hook_region(
                block, pages, ro_rows[i], cs[i].tolist(), bool(thr[i]), bool(first_touch[i])
            )
        return mask

    def _access_hooks(self, rows: slice | np.ndarray) -> None:
        """ "full" visibility: block_access once per resident block touched by the trace ``rows``."""
        gp = self.gp[rows]
        hit_blocks = self.trace.block[rows][self.resident[gp]]
        if not len(hit_blocks):
            return
        blocks, hits = np.unique(hit_blocks, return_counts=True)
        for block, n in zip(blocks.tolist(), hits.tolist(), strict=True):
            ctx = DecisionContext("reorder")
            action = self.ops.block_access(self.view, block, n, ctx)
            if self._apply(block, ctx):
                continue
            if action == DEFAULT and self.lists.list_of(block) == ChunkLists.USED:
                self.lists.used.move_to_end(block)  # native move to the used tail (gpu_ext's block_access)
            elif action not in (DEFAULT, BYPASS):
                self.counts["REJECT_ACTION"] += 1
