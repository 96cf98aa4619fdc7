"""Replay a page-access trace through the UVM model with one ops table; count faults, bytes and time.

Hits are found vectorised: between two fault batches nothing changes, so one numpy gather over the
residency bitmap classifies a whole stretch of accesses. Python runs only per fault batch, per VA block
in it (prefetch, allocation, activation) and per eviction — which is where gpu_ext's hooks run too.
An ops table that is the driver (no hook overridden) is replayed by the compiled twin of this module,
``memory.compiled``, with identical results (tests/memory/test_compiled.py).

A step (``Trace.time``) is a set of concurrent accesses: its faults are the distinct non-resident pages it
touches (coalesced), serviced in batches of 256 in address order (``uvm_perf_fault_batch_count``, NVIDIA
open-gpu-kernel-modules ``uvm_gpu_replayable_faults.c``); the next step sees the
result. Capacity is ``floor(working set / oversub)`` chunks of 2 MB.

A trace with streams (``Trace.stream``: the issuing GPU thread of each access) is replayed with
per-stream progress instead, unless ``SimConfig.stream_progress`` is off: in rounds, every stream that may
run (its kernel has started, see ``workloads``) passes over its resident accesses and stops at its next
non-resident one; the round's faults are those stopped accesses, coalesced and batched as above. A
warp stalls only on its own replayable fault while the others run on (replayable faults are fetched in
batches and replayed; gpu_ext's uvmbench kernels run 65 536 threads that each walk their own tile), so a
stream whose block
arrived whole runs through it without waiting for the others. Lockstep is the model the figures before
this change were made with; it is what ``stream_progress=False`` replays.
"""

from __future__ import annotations

import itertools
import math
import time as _time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from gpuslice.memory.cost import CostModel
from gpuslice.memory.fault_service import FaultService, overrides
from gpuslice.memory.hooks import Composed, MemoryOps
from gpuslice.memory.uvm import FAULT_BATCH, PAGE_BYTES, PAGES_PER_BLOCK, ThrashingParams
from gpuslice.memory.workloads import Trace

__all__ = ["SimConfig", "SimResult", "capacity_for", "simulate"]

_P = PAGES_PER_BLOCK


@dataclass(frozen=True)
class SimConfig:
    """How to run: oversubscription (working set / GPU capacity), hook visibility, cost model.

    ``stream_progress``: replay a trace that has streams with per-stream progress (module docstring); off,
    every trace is replayed in lockstep. ``preferred_gpu``: the GPU is the blocks' preferred location,
    so a first-touch fault takes the whole block (``uvm_perf_prefetch.c``). Off by default: plain managed
    memory, as in uvmbench's ``uvm`` mode and gpu_ext's UVM baselines, sets no preferred location.
    ``priorities`` maps tenant → "high"/"low"; by default a multi-tenant trace has tenant 0 high and
    tenant 1 low, a single-tenant trace has no priorities.
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
    # A policy file's faults (``hook:reason``), where the driver's policy decided instead
    policy_faults: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def capacity_for(trace: Trace, oversub: float) -> int:
    """GPU capacity in 2 MB chunks for an oversubscription ratio (≥ 1 chunk)."""
    return max(1, math.floor(trace.working_set_blocks / oversub + 1e-9))


class _Run(FaultService):
    """One replay: the fault service plus the three ways of walking the trace (lockstep, per-stream
    progress, compiled); ``simulate`` is the public entry."""

    def __init__(self, trace: Trace, ops: MemoryOps, config: SimConfig, vectorised: bool = True) -> None:
        super().__init__(trace, ops, config, capacity_for(trace, config.oversub), vectorised)

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
            overrides(self.ops, h) for h in ("block_activate", "evict_prepare", "page_prefetch")
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
        policy_faults=_policy_faults(ops),
    )


def _policy_faults(ops: MemoryOps) -> dict[str, int]:
    """The guard's faults of each half that is a policy file (``programs/guard_memory.py``)."""
    halves = (ops.evict, ops.prefetch) if isinstance(ops, Composed) else (ops,)
    faults: dict[str, int] = {}
    for half in dict.fromkeys(halves):
        guard = getattr(half, "guard", None)
        if guard is not None:
            faults.update(guard.fault_counts())
    return faults
