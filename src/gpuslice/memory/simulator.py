"""Replay a page-access trace through the UVM model with one ops table; count faults, bytes and time.

Hits are found vectorised: between two fault batches nothing changes, so one numpy gather over the
residency bitmap classifies a whole stretch of accesses. Python runs only per fault batch, per VA block
in it (prefetch, allocation, activation) and per eviction — which is where gpu_ext's hooks run too.
An ops table that is the driver (no hook overridden) is replayed by the compiled twin of this module,
``memory.compiled``, with identical results (tests/memory/test_compiled.py).

A step (``Trace.time``) is a set of concurrent accesses: its faults are the distinct non-resident pages it
touches (coalesced), serviced in batches of 256 in address order (research §3); the next step sees the
result. Capacity is ``floor(working set / oversub)`` chunks of 2 MB.

A trace with streams (``Trace.stream``: the issuing GPU thread of each access) is replayed with
per-stream progress instead, unless ``SimConfig.stream_progress`` is off: in rounds, every stream that may
run (its kernel has started, see ``workloads``) passes over its resident accesses and stops at its next
non-resident one; the round's faults are those stopped accesses, coalesced and batched as above. A
warp stalls only on its own replayable fault while the others run on (research §3: faults are fetched in
batches and replayed; §5.3: uvmbench's 65 536 threads each walk their own tile), so a stream whose block
arrived whole runs through it without waiting for the others. Lockstep is the model the figures before
this change were made with; it is what ``stream_progress=False`` replays.
"""

from __future__ import annotations

import itertools
import math
import time as _time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from gpuslice.memory.cost import CostModel
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
    ThrashingParams,
    native_prefetch_mask,
    native_region,
    tree_counts,
)
from gpuslice.memory.workloads import Trace

__all__ = ["SimConfig", "SimResult", "capacity_for", "simulate"]

_P = PAGES_PER_BLOCK
_NO = np.zeros(FAULT_BATCH, dtype=bool)  # no first-touch rows (a batch spans at most 256 blocks)


@dataclass(frozen=True)
class SimConfig:
    """How to run: oversubscription (working set / GPU capacity), hook visibility, cost model.

    ``stream_progress``: replay a trace that has streams with per-stream progress (module docstring); off,
    every trace is replayed in lockstep. ``preferred_gpu``: the GPU is the blocks' preferred location, so
    a first-touch fault takes the whole block (research §3). Off by default: plain managed memory, as in
    uvmbench's ``uvm`` mode and gpu_ext's UVM baselines, sets no preferred location. ``priorities`` maps
    tenant → "high"/"low"; by default a multi-tenant trace has tenant 0 high and tenant 1 low, a
    single-tenant trace has no priorities.
    """

    oversub: float = 1.5
    visibility: str = "driver"
    cost: CostModel = field(default_factory=CostModel)
    preferred_gpu: bool = False
    thrashing: ThrashingParams = field(default_factory=ThrashingParams)
    priorities: dict[int, str] | None = None
    stream_progress: bool = True


@dataclass(frozen=True)
class SimResult:
    """Counts and estimated time of one run; ``faults`` are coalesced page faults, ``chunk_faults`` the
    times a VA block had no chunk when it faulted, ``requests`` the policy requests by result code."""

    workload: str
    oversub: float
    evict: str
    prefetch: str
    accesses: int
    capacity_chunks: int
    faults: int
    chunk_faults: int
    batches: int
    evictions: int
    migrated_bytes: int
    evicted_bytes: int
    thrashing_events: int
    estimated_seconds: float
    tenant_seconds: tuple[float, ...]
    requests: dict[str, int]
    wall_seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def capacity_for(trace: Trace, oversub: float) -> int:
    """GPU capacity in 2 MB chunks for an oversubscription ratio (≥ 1 chunk)."""
    return max(1, math.floor(trace.working_set_blocks / oversub + 1e-9))


def _default_priorities(trace: Trace) -> dict[int, str]:
    return {0: PRIORITY_HIGH, 1: PRIORITY_LOW} if trace.tenants > 1 else {}


def _overrides(ops: MemoryOps, hook: str) -> bool:
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


class _Run:
    """State of one replay; ``simulate`` is the public entry."""

    def __init__(self, trace: Trace, ops: MemoryOps, config: SimConfig, vectorised: bool = True) -> None:
        if config.visibility not in VISIBILITIES:
            raise ValueError(f"visibility must be one of {VISIBILITIES}")
        self.trace, self.ops, self.cfg = trace, ops, config
        self.capacity = capacity_for(trace, config.oversub)
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
        self.native = not _overrides(ops, "page_prefetch")
        self.hook_activate = _overrides(ops, "block_activate")
        self.hook_evict = _overrides(ops, "evict_prepare")
        self.faults = self.chunk_faults = self.batches = self.evictions = 0
        self.migrated_pages = self.evicted_pages = 0
        # clock = compute of the accesses issued so far + service time of the batches so far; set from the
        # two sums (not accumulated step by step) so that every replay path gets the same float bits
        self.clock = self.service_s = 0.0
        tenants = max(1, trace.tenants)
        self.tenant_s = np.zeros(tenants)
        self.tenant_bytes = np.zeros(tenants)

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
                    region = (page, page + 1)  # thrashing pages are excluded from native prefetch (§3)
                elif first_touch:
                    region = (0, _P)
                else:
                    region = native_region(cs, page)
            first, outer = region
            out[first:outer] = True
            if outer >= _P:
                break  # the driver stops once the region reaches the end of the block (research §1.1)
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
        self.lists.activate(block)  # the driver's own tail move comes first (research §1.1)
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
                self.lists.used.move_to_end(block)  # native move to the used tail (research §1.1)
            elif action not in (DEFAULT, BYPASS):
                self.counts["REJECT_ACTION"] += 1

    def run(self, progress: Callable[[int], None] | None = None) -> None:
        trace = self.trace
        n = len(trace)
        self.gp = trace.block.astype(np.int64) * _P + trace.page
        bounds = np.flatnonzero(trace.time[1:] != trace.time[:-1]) + 1
        tenant_access = np.bincount(trace.tenant, minlength=len(self.tenant_s))
        self.tenant_s += tenant_access * self.cfg.cost.per_access_s
        self.ops.init(self.view)
        full = self.cfg.visibility == "full"
        compute = self.cfg.cost.compute_seconds
        pos = hit_start = 0
        window = 4096
        last_report = 0
        while pos < n:
            end_w = min(n, pos + window)
            miss = np.flatnonzero(~self.resident[self.gp[pos:end_w]])
            if not miss.size:
                pos = end_w
                window = min(window * 2, 1 << 20)
                continue
            i = pos + int(miss[0])
            k = int(np.searchsorted(bounds, i, side="right"))
            end = int(bounds[k]) if k < len(bounds) else n
            seg = self.gp[i:end]
            faulted = np.unique(seg[~self.resident[seg]])
            if full:
                self._access_hooks(slice(hit_start, end))
            self.faults += len(faulted)
            self.view.position = end
            for b in range(0, len(faulted), FAULT_BATCH):
                self.clock = self.view.now_s = compute(end) + self.service_s
                self.service(faulted[b : b + FAULT_BATCH])
            window = max(256, 2 * (end - pos))
            pos = hit_start = end
            if progress is not None and pos - last_report > 65536:
                progress(pos - last_report)
                last_report = pos
        if full and hit_start < n:
            self._access_hooks(slice(hit_start, n))
        self.clock = compute(n) + self.service_s
        if progress is not None:
            progress(n - last_report)

    def streams(self) -> bool:
        """Whether this run uses per-stream progress."""
        return self.trace.stream is not None and self.cfg.stream_progress

    def run_streams(self, progress: Callable[[int], None] | None = None) -> None:
        """Per-stream progress (module docstring), in rounds; each round a few numpy operations advance
        every eligible stream to its next non-resident access."""
        trace, compute = self.trace, self.cfg.cost.compute_seconds
        n = len(trace)
        self.gp = trace.block.astype(np.int64) * _P + trace.page
        self.tenant_s += np.bincount(trace.tenant, minlength=len(self.tenant_s)) * self.cfg.cost.per_access_s
        self.ops.init(self.view)
        order, off, first_t, last_t = stream_layout(trace)
        cur, end = off[:-1].copy(), off[1:]
        full = self.cfg.visibility == "full"
        look = 64  # accesses examined per stream per pass while looking for its next miss
        last_report = 0
        while True:
            live = cur < end
            if not live.any():
                break
            eligible = np.flatnonzero(live & (first_t <= last_t[live].min()))
            passed = []  # trace rows passed over (hits) this round, for the access hook
            pending = eligible
            while pending.size:
                idx = cur[pending, None] + np.arange(look)[None, :]
                valid = idx < end[pending, None]
                rows = order[np.minimum(idx, n - 1)]
                miss = valid & ~self.resident[self.gp[rows]]
                hit = miss.any(axis=1)
                step = np.where(hit, miss.argmax(axis=1), valid.sum(axis=1))
                if full:
                    passed.append(rows[np.arange(look)[None, :] < step[:, None]])
                cur[pending] += step
                pending = pending[~hit & (cur[pending] < end[pending])]
            stopped = eligible[cur[eligible] < end[eligible]]
            if full:
                self._access_hooks(np.concatenate(passed))
            if not stopped.size:
                continue
            at = order[cur[stopped]]
            faulted = np.unique(self.gp[at])
            self.faults += len(faulted)
            issued = int((cur - off[:-1]).sum()) + len(stopped)
            # Belady's "now": the earliest trace row still to run (an approximation here: with per-stream
            # progress the future order depends on the schedule, so no offline order is exact)
            self.view.position = int(order[cur[stopped]].min())
            for b in range(0, len(faulted), FAULT_BATCH):
                self.clock = self.view.now_s = compute(issued) + self.service_s
                self.service(faulted[b : b + FAULT_BATCH])
            if progress is not None and issued - last_report > 65536:
                progress(issued - last_report)
                last_report = issued
        self.clock = compute(n) + self.service_s
        if progress is not None:
            progress(n - last_report)

    def compilable(self) -> bool:
        """Whether the compiled replay computes this run: driver visibility and an ops table that overrides
        none of the hooks the driver-visible replay calls (it *is* the driver)."""
        return self.cfg.visibility == "driver" and not any(
            _overrides(self.ops, h) for h in ("block_activate", "evict_prepare", "page_prefetch")
        )

    def run_compiled(self, progress: Callable[[int], None] | None = None) -> None:
        """``run`` for the driver's own policies, in numba (``memory.compiled``); same results."""
        from gpuslice.memory import compiled  # numba loads (or compiles, first time) only when used

        trace, cost = self.trace, self.cfg.cost
        n = len(trace)
        gp = trace.block.astype(np.int64) * _P + trace.page
        self.tenant_s += np.bincount(trace.tenant, minlength=len(self.tenant_s)) * cost.per_access_s
        self.ops.init(self.view)
        state = compiled.CompiledState(trace.blocks, len(self.tenant_s))
        state.tenant_s[:] = self.tenant_s
        config = (trace.owner, self.capacity, cost, self.cfg.thrashing, self.cfg.preferred_gpu)
        if self.streams():
            compiled.replay_streams(state, gp, stream_layout(trace), *config)
            if progress is not None:
                progress(n)
        else:
            starts = np.append(np.flatnonzero(np.r_[True, trace.time[1:] != trace.time[:-1]]), n)
            # slices of about 64 k accesses, so a progress bar moves while the replay runs
            cuts = np.unique(np.r_[0, np.searchsorted(starts, np.arange(65536, n, 65536)), len(starts) - 1])
            for s0, s1 in itertools.pairwise(cuts.tolist()):
                compiled.replay_steps(state, gp, starts, s0, s1, *config)
                if progress is not None:
                    progress(int(starts[s1] - starts[s0]))
        c = state.counters
        self.faults, self.chunk_faults = int(c[compiled.FAULTS]), int(c[compiled.CHUNK_FAULTS])
        self.batches, self.evictions = int(c[compiled.BATCHES]), int(c[compiled.EVICTIONS])
        self.migrated_pages, self.evicted_pages = int(c[compiled.MIGRATED]), int(c[compiled.EVICTED])
        self.thrash.total_events = int(c[compiled.THRASH_EVENTS])
        self.service_s = float(state.service_s[0])
        self.clock = cost.compute_seconds(n) + self.service_s
        self.tenant_s = state.tenant_s


def stream_layout(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(order, off, first_t, last_t): ``order[off[s]:off[s+1]]`` are stream s's trace rows in issue order
    (streams renumbered densely), ``first_t``/``last_t`` the times of its first and last access."""
    assert trace.stream is not None
    order = np.argsort(trace.stream, kind="stable")
    _, first = np.unique(trace.stream[order], return_index=True)
    off = np.append(first, len(trace)).astype(np.int64)
    return order.astype(np.int64), off, trace.time[order[off[:-1]]], trace.time[order[off[1:] - 1]]


def simulate(
    trace: Trace,
    ops: MemoryOps,
    config: SimConfig | None = None,
    evict_name: str | None = None,
    prefetch_name: str | None = None,
    progress: Callable[[int], None] | None = None,
    vectorised: bool = True,
    compiled: bool = True,
) -> SimResult:
    """Replay ``trace`` with ``ops`` (a policy or a ``Composed`` pair); ``progress(k)`` is told of every k
    accesses done. The names only label the result (default: from ``ops``). The driver's own policies
    run compiled (``memory.compiled``) unless ``compiled=False``; ``vectorised=False`` runs the
    one-block-at-a-time reference service of the general path. All paths give the same results (tests)."""
    config = config or SimConfig()
    run = _Run(trace, ops, config, vectorised)
    t0 = _time.perf_counter()
    if compiled and vectorised and run.compilable():
        run.run_compiled(progress)
    elif run.streams():
        run.run_streams(progress)
    else:
        run.run(progress)
    wall = _time.perf_counter() - t0
    if isinstance(ops, Composed):
        evict_name = evict_name or ops.evict.name
        prefetch_name = prefetch_name or ops.prefetch.name
    return SimResult(
        workload=trace.name,
        oversub=config.oversub,
        evict=evict_name or ops.name,
        prefetch=prefetch_name or ops.name,
        accesses=len(trace),
        capacity_chunks=run.capacity,
        faults=run.faults,
        chunk_faults=run.chunk_faults,
        batches=run.batches,
        evictions=run.evictions,
        migrated_bytes=run.migrated_pages * PAGE_BYTES,
        evicted_bytes=run.evicted_pages * PAGE_BYTES,
        thrashing_events=run.thrash.total_events,
        estimated_seconds=run.clock,
        tenant_seconds=tuple(float(x) for x in run.tenant_s),
        requests={k: int(v) for k, v in run.counts.items()},
        wall_seconds=wall,
    )
