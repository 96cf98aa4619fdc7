"""Compiled replay of the driver's own policies (default eviction + native tree prefetch), for speed.

Why it exists: the general replay (``simulator._Run``) calls Python hooks and runs a few dozen numpy
operations per fault batch. Where almost every trace step faults (rand-stream, pointer-chase:
64 accesses and ~40 chunk faults per step; faiss-search: 85 accesses per batch) the 2 M accesses/s
target leaves ~30 µs per step, less than numpy's per-call overhead allows, so the driver's
own behaviour is compiled with numba and the general path stays the readable specification.

What it computes is exactly ``simulator._Run`` with an ops table that overrides no hook, driver
visibility: steps in order; a step's distinct non-resident pages are its faults, sorted and serviced in
batches of 256 (the driver's batch); per VA block of a batch, in address order, the reference service of
``_Run._service_batch_reference`` — chunk fault → evict the head of ``used`` (the unused list stays
empty without a policy) → thrashing check → native 51 % tree over 64 KB-grown faults (``uvm``) →
migrate → move to the used tail. Float sums are done in the same order as the Python path, so the
``SimResult`` is identical bit for bit; ``tests/memory/test_compiled.py`` checks every workload.

State lives in numpy arrays owned by the caller so that the replay can run a slice of steps at a time
(progress reports between slices) and resume.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gpuslice.memory.uvm import BIG_PAGE_PAGES, FAULT_BATCH, PAGE_BYTES, PAGES_PER_BLOCK, TREE_THRESHOLD_PCT

__all__ = ["CompiledState", "replay_steps", "replay_streams"]

_P = PAGES_PER_BLOCK
_NBIG = PAGES_PER_BLOCK // BIG_PAGE_PAGES  # 32 big pages per block
_BIG_SHIFT = 4  # log2(BIG_PAGE_PAGES)
_TOP_LEVEL = 9  # log2(512): the tree root is the whole block (uvm.TREE_LEVELS - 1)
assert 1 << _BIG_SHIFT == BIG_PAGE_PAGES and 1 << _TOP_LEVEL == _P

# indices into CompiledState.counters
FAULTS, CHUNK_FAULTS, BATCHES, EVICTIONS, MIGRATED, EVICTED, THRASH_EVENTS, HEAD, TAIL, SIZE = range(10)


class CompiledState:
    """Arrays the compiled replay reads and updates; ``counters`` holds the integer totals (see indices
    above), ``service_s`` the summed batch service time, ``tenant_s`` each tenant's time."""

    def arrays(self) -> tuple:
        """The arrays in the order the compiled functions unpack them (``st``)."""
        return (
            self.resident,
            self.res_count,
            self.big_count,
            self.prev,
            self.next,
            self.on_list,
            self.evicted_at,
            self.events,
            self.epoch_start,
            self.counters,
            self.service_s,
            self.tenant_s,
        )

    def __init__(self, blocks: int, tenants: int) -> None:
        self.resident = np.zeros(blocks * _P, dtype=np.bool_)
        self.res_count = np.zeros(blocks, dtype=np.int64)
        self.big_count = np.zeros(blocks * _NBIG, dtype=np.int64)  # resident pages per 64 KB big page
        # the used list as a doubly linked list over block ids (-1 = none): O(1) tail move and head pop
        self.prev = np.full(blocks, -1, dtype=np.int64)
        self.next = np.full(blocks, -1, dtype=np.int64)
        self.on_list = np.zeros(blocks, dtype=np.bool_)
        self.evicted_at = np.full(blocks, -np.inf)
        self.events = np.zeros(blocks, dtype=np.int64)
        self.epoch_start = np.zeros(blocks)
        self.counters = np.zeros(10, dtype=np.int64)
        self.counters[HEAD] = self.counters[TAIL] = -1
        self.service_s = np.zeros(1)
        self.tenant_s = np.zeros(max(1, tenants))


@njit(cache=True)
def _unlink(st_prev, st_next, counters, block):
    p, n = st_prev[block], st_next[block]
    if p >= 0:
        st_next[p] = n
    else:
        counters[HEAD] = n
    if n >= 0:
        st_prev[n] = p
    else:
        counters[TAIL] = p
    st_prev[block] = -1
    st_next[block] = -1


@njit(cache=True)
def _append(st_prev, st_next, counters, block):
    tail = counters[TAIL]
    st_prev[block] = tail
    st_next[block] = -1
    if tail >= 0:
        st_next[tail] = block
    else:
        counters[HEAD] = block
    counters[TAIL] = block


@njit(cache=True)
def _prefetch_block(resident, big_count, base, faulted, a, b, thrashing, whole_block, cnt, fbig):
    """Mark the native prefetch of one block's faulted pages ``faulted[a:b]`` (global page numbers, block
    starting at ``base``) resident: ``uvm.native_prefetch_mask`` applied in place. Returns the number of
    pages that became resident."""
    new = 0
    if thrashing:  # thrashing pages: the faulted pages only, no growth, no prefetch (uvm_perf_prefetch.c)
        for j in range(a, b):
            q = faulted[j]
            if not resident[q]:
                resident[q] = True
                big_count[q >> _BIG_SHIFT] += 1
                new += 1
        return new
    if whole_block:
        for q in range(base, base + _P):
            if not resident[q]:
                resident[q] = True
                big_count[q >> _BIG_SHIFT] += 1
                new += 1
        return new
    for g in range(_NBIG):
        fbig[g] = False
    for j in range(a, b):
        fbig[(faulted[j] - base) >> _BIG_SHIFT] = True
    big0 = base >> _BIG_SHIFT
    for g in range(_NBIG):  # occupied pages per big page: resident, or a faulted big page (64 KB growth)
        cnt[g] = BIG_PAGE_PAGES if fbig[g] else big_count[big0 + g]
    covered = -1
    for g in range(_NBIG):
        if not fbig[g] or g * BIG_PAGE_PAGES < covered:
            continue
        # native_region from the root down; at the big page level the node is full, so it qualifies
        first, outer = g * BIG_PAGE_PAGES, (g + 1) * BIG_PAGE_PAGES
        for k in range(_TOP_LEVEL, _BIG_SHIFT, -1):
            span = 1 << (k - _BIG_SHIFT)
            g0 = (g // span) * span
            c = 0
            for h in range(g0, g0 + span):
                c += cnt[h]
            if c * 100 > (1 << k) * TREE_THRESHOLD_PCT:
                first, outer = g0 * BIG_PAGE_PAGES, (g0 + span) * BIG_PAGE_PAGES
                break
        for q in range(base + first, base + outer):
            if not resident[q]:
                resident[q] = True
                big_count[q >> _BIG_SHIFT] += 1
                new += 1
        covered = outer
    return new


# scalar parameters, packed into one float64 array: index constants
PER_ACCESS, OVERHEAD, LINK, THR_THRESHOLD, THR_LAPSE, THR_EPOCH, PREFERRED, CAPACITY = range(8)


@njit(cache=True)
def _service_faults(faulted, issued, prm, owner, st, scratch):
    """Service one step's (or round's) sorted, distinct faulted pages in batches of 256 (the driver's):
    ``_Run._service_batch_reference`` then ``_Run._charge`` per batch. ``issued`` = accesses issued so far
    (the compute part of the clock); ``st`` = ``CompiledState.arrays()``."""
    resident, res_count, big_count, st_prev, st_next, on_list, evicted_at, events, epoch_start = st[:9]
    counters, service_s, tenant_s = st[9:]
    nt = tenant_s.shape[0]
    moved_in, moved_out, waiting, cnt, fbig = scratch
    capacity = np.int64(prm[CAPACITY])
    link = prm[LINK]
    nf = faulted.shape[0]
    counters[FAULTS] += nf
    for bs in range(0, nf, FAULT_BATCH):
        be = min(nf, bs + FAULT_BATCH)
        now = issued * prm[PER_ACCESS] + service_s[0]  # the Python clock: compute so far + service so far
        moved_in[:] = 0.0
        moved_out[:] = 0.0
        waiting[:] = False
        i = bs
        while i < be:
            block = faulted[i] // _P
            j = i + 1
            while j < be and faulted[j] // _P == block:
                j += 1
            t = owner[block]
            waiting[t] = True
            if not on_list[block]:
                counters[CHUNK_FAULTS] += 1
                if counters[SIZE] >= capacity:  # victim: head of used (unused stays empty)
                    victim = counters[HEAD]
                    _unlink(st_prev, st_next, counters, victim)
                    on_list[victim] = False
                    counters[SIZE] -= 1
                    counters[EVICTIONS] += 1
                    evicted_at[victim] = now
                    moved_out[t] += res_count[victim]
                    for q in range(victim * _P, (victim + 1) * _P):
                        resident[q] = False
                    for g in range(victim * _NBIG, (victim + 1) * _NBIG):
                        big_count[g] = 0
                    res_count[victim] = 0
                # Thrashing.on_fault_in
                if now - epoch_start[block] > prm[THR_EPOCH]:
                    events[block] = 0
                    epoch_start[block] = now
                if now - evicted_at[block] < prm[THR_LAPSE]:
                    events[block] += 1
                    counters[THRASH_EVENTS] += 1
                thrashing = events[block] >= prm[THR_THRESHOLD]
            else:  # Thrashing.is_thrashing
                thrashing = events[block] >= prm[THR_THRESHOLD] and now - epoch_start[block] <= prm[THR_EPOCH]
            whole = prm[PREFERRED] != 0.0 and res_count[block] == 0
            new = _prefetch_block(resident, big_count, block * _P, faulted, i, j, thrashing, whole, cnt, fbig)
            res_count[block] += new
            moved_in[t] += new
            # ChunkLists.activate: to the tail of used
            if on_list[block]:
                _unlink(st_prev, st_next, counters, block)
            else:
                on_list[block] = True
                counters[SIZE] += 1
            _append(st_prev, st_next, counters, block)
            i = j
        # _Run._charge
        total_in = 0.0
        total_out = 0.0
        for t in range(nt):
            total_in += moved_in[t]
            total_out += moved_out[t]
        moved = np.int64(total_in + total_out)
        counters[BATCHES] += 1
        counters[MIGRATED] += np.int64(total_in)
        counters[EVICTED] += np.int64(total_out)
        service_s[0] += prm[OVERHEAD] + (moved * PAGE_BYTES) / link
        for t in range(nt):
            if waiting[t]:
                tenant_s[t] += prm[OVERHEAD]
        for t in range(nt):
            tenant_s[t] += (moved_in[t] + moved_out[t]) * PAGE_BYTES / link


@njit(cache=True)
def _scratch(nt):
    """Per-batch work arrays, allocated once per replay: moved in/out and waiting per tenant, occupied
    pages and faulted flags per big page."""
    return (
        np.zeros(nt),
        np.zeros(nt),
        np.zeros(nt, dtype=np.bool_),
        np.zeros(_NBIG, dtype=np.int64),
        np.zeros(_NBIG, dtype=np.bool_),
    )


@njit(cache=True)
def _sorted_distinct(buf, m):
    """Sort ``buf[:m]`` in place and drop repeats; returns the view of the distinct pages (address order)."""
    head = buf[:m]
    head.sort()
    k = 0
    for j in range(m):
        if j == 0 or head[j] != head[k - 1]:
            head[k] = head[j]
            k += 1
    return buf[:k]


@njit(cache=True)
def _replay(gp, starts, s0, s1, owner, prm, st):
    """Lockstep: steps ``[s0, s1)``; a step's distinct non-resident pages are its faults."""
    resident = st[0]
    buf = np.empty(0, dtype=np.int64)
    scratch = _scratch(st[11].shape[0])
    for s in range(s0, s1):
        a, b = starts[s], starts[s + 1]
        m = 0
        for j in range(a, b):
            if not resident[gp[j]]:
                m += 1
        if m == 0:
            continue
        if buf.shape[0] < m:
            buf = np.empty(m, dtype=np.int64)
        m = 0
        for j in range(a, b):
            if not resident[gp[j]]:
                buf[m] = gp[j]
                m += 1
        faulted = _sorted_distinct(buf, m)  # coalesced, address order
        _service_faults(faulted, b, prm, owner, st, scratch)


@njit(cache=True)
def _replay_streams(gp, order, off, first_t, last_t, owner, prm, st):
    """Per-stream progress (``_Run.run_streams``): each round, every eligible stream runs to its next
    non-resident access; those accesses are the round's faults."""
    resident = st[0]
    ns = off.shape[0] - 1
    cur = off[:-1].copy()
    buf = np.empty(ns, dtype=np.int64)
    scratch = _scratch(st[11].shape[0])
    while True:
        horizon = np.iinfo(np.int64).max
        for s in range(ns):
            if cur[s] < off[s + 1] and last_t[s] < horizon:
                horizon = last_t[s]
        if horizon == np.iinfo(np.int64).max:
            break  # every stream finished
        m = 0
        issued = 0
        for s in range(ns):
            if cur[s] < off[s + 1] and first_t[s] <= horizon:
                c = cur[s]
                while c < off[s + 1] and resident[gp[order[c]]]:
                    c += 1
                cur[s] = c
                if c < off[s + 1]:
                    buf[m] = gp[order[c]]
                    m += 1
            issued += cur[s] - off[s]
        if m:
            _service_faults(_sorted_distinct(buf, m), issued + m, prm, owner, st, scratch)


def _params(capacity: int, cost, thrashing, preferred_gpu: bool) -> np.ndarray:
    prm = np.zeros(8)
    prm[PER_ACCESS], prm[OVERHEAD], prm[LINK] = (
        cost.per_access_s,
        cost.batch_overhead_s,
        cost.link_bytes_per_s,
    )
    prm[THR_THRESHOLD], prm[THR_LAPSE], prm[THR_EPOCH] = (
        thrashing.threshold,
        thrashing.lapse_s,
        thrashing.epoch_s,
    )
    prm[PREFERRED], prm[CAPACITY] = float(preferred_gpu), capacity
    return prm


def replay_steps(
    state: CompiledState,
    gp: np.ndarray,
    starts: np.ndarray,
    s0: int,
    s1: int,
    owner: np.ndarray,
    capacity: int,
    cost,
    thrashing,
    preferred_gpu: bool,
) -> None:
    """Lockstep replay of trace steps ``[s0, s1)`` (``starts[s]`` = first access of step s) into ``state``."""
    _replay(gp, starts, s0, s1, owner, _params(capacity, cost, thrashing, preferred_gpu), state.arrays())


def replay_streams(
    state: CompiledState,
    gp: np.ndarray,
    layout,
    owner: np.ndarray,
    capacity: int,
    cost,
    thrashing,
    preferred_gpu: bool,
) -> None:
    """Per-stream replay of the whole trace; ``layout`` = (order, off, first_t, last_t) of
    ``simulator.stream_layout``."""
    prm = _params(capacity, cost, thrashing, preferred_gpu)
    _replay_streams(gp, *layout, owner, prm, state.arrays())
