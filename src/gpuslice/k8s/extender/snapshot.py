"""The cluster as the extender's ledger sees it, in one read: for the dashboard (``cluster_view``, JSON)
and the metrics (``cluster_figures``, numpy). Both come from one ledger build (``ClusterCache.ledgered``)
copied under the cache's lock (its columns and live placements: microseconds), then computed outside it,
so a view of 1,000 nodes holds up no bind. No API call: everything is in the watch's state.

``cluster_view(state, history)`` (plain JSON types; sizes in MiB, compute in milli-GPU, shares in %):

```text
time                 unix seconds of the read
synced               the extender has taken in its first full lists of nodes and pods
fragmentation_target the workload FGD's measure is taken against: "operator" (--target-workload),
                     "bound pods" (their shapes when the ledger was built) or "one whole GPU" (no pod yet)
totals               nodes, gpus, unallocated_percent, fragmentation_percent, pending, preemptions,
                     capacity_milli, allocated_milli, fragmented_milli
nodes[]              by name: name, model, unallocated_percent, fragmentation_percent, gpus[]
  gpus[]             index, uuid, healthy, mig (in MIG mode), milli_free, memory_mib, memory_free_mib,
                     slices[]
    slices[]         pod ("namespace/name"), milli, memory_mib (a slice without a memory limit: the
                     GPU's), mig_profile, mig_start and mig_slots (null for a share or a whole GPU)
pending[]            oldest first: pod, code (a fixed reason code), reason (its FailedScheduling line,
                     with the amounts), since (unix seconds of its first refusal)
claims[]             DRA claims gpuslice's driver holds (``claims.ClaimReader``): claim, node, pool,
                     devices, share; ``claims_error``: why they could not be listed ("" when they were)
history[]            oldest first: t, unallocated_percent, fragmentation_percent (``FragmentationHistory``)
```

What a slice holds, what is unallocated and what fragmentation means are ``observe.cluster_metrics``'s
definitions (``tally_gpus``; FGD's measure from ``ledger.fragmentation``), the same for the view and the
metrics. The fragmentation target is the one the extender's ``fgd`` policy uses (``ClusterCache.placer``).

Cost at 1,000 nodes × 8 GPUs × 10 pods each: benchmarks/cluster_metrics.py.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuslice.k8s.extender.claims import ClaimReader
from gpuslice.k8s.extender.cluster import BoundPod, LedgerBuild, PendingPod
from gpuslice.k8s.extender.state import ClusterState
from gpuslice.ledger.placement import Placement
from gpuslice.observe.cluster_metrics import (
    WHOLE_GPU_TARGET,
    ClusterFigures,
    GpuTally,
    ledger_figures,
    pending_by_reason,
)
from gpuslice.units import MiB
from gpuslice.workload.request import MILLI_PER_GPU
from gpuslice.workload.target import TargetWorkload

__all__ = [
    "HISTORY_INTERVAL_S",
    "HISTORY_MAX_AGE_S",
    "FragmentationHistory",
    "cluster_figures",
    "cluster_view",
]

HISTORY_INTERVAL_S = 30.0  # Prometheus' usual scrape interval; a dashboard refreshing every 3 s adds nothing
HISTORY_MAX_AGE_S = 24 * 3600.0  # 2,880 samples of three floats


class FragmentationHistory:
    """The cluster's unallocated and fragmented shares over time: a ring of samples taken at most every
    ``interval_s``, the last ``max_age_s`` kept.

    Sampled by whoever reads the figures (``cluster_view``, a metrics scrape), not by a thread of its
    own: the figures are computed then anyway, so a sample costs nothing, and a thread would read the
    ledger every ``interval_s`` even when no one looks. Prometheus scrapes every 15-60 s, which fills
    the ring at about ``interval_s``; a time no one looked shows as a gap between two samples' ``t``.
    Thread-safe."""

    def __init__(self, interval_s: float = HISTORY_INTERVAL_S, max_age_s: float = HISTORY_MAX_AGE_S) -> None:
        if not (interval_s > 0 and max_age_s >= interval_s):
            raise ValueError("FragmentationHistory: interval_s must be positive and at most max_age_s")
        self.interval_s = interval_s
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=math.ceil(max_age_s / interval_s) + 1)

    def observe(self, figures: ClusterFigures, now: float) -> None:
        """Record the figures' cluster totals at ``now`` (unix seconds) unless the last sample is newer
        than ``interval_s``."""
        with self._lock:
            if self._samples and now - self._samples[-1][0] < self.interval_s:
                return
            self._samples.append(
                (
                    now,
                    100.0 * figures.cluster_ratio(figures.unallocated_milli),
                    100.0 * figures.cluster_ratio(figures.fragmented_milli),
                )
            )

    def samples(self, now: float | None = None) -> list[dict[str, float]]:
        """The samples of the last ``max_age_s`` before ``now`` (default: the newest's time), oldest
        first, as the view gives them."""
        with self._lock:
            rows = list(self._samples)
        if not rows:
            return []
        newest = rows[-1][0] if now is None else now
        return [
            {"t": t, "unallocated_percent": unallocated, "fragmentation_percent": fragmented}
            for t, unallocated, fragmented in rows
            if newest - t <= self.max_age_s
        ]


@dataclass(frozen=True, slots=True)
class _Reading:
    """What one read copied from the cache, consistent with one ledger build."""

    built: LedgerBuild
    nodes: int  # ledger rows with an inventory (a cluster without one has a placeholder row)
    free_gpu_milli: np.ndarray
    placements: list[Placement]  # every slice the pods hold (the build's own blockers are no pod's)
    holders: list[BoundPod]  # the pod of each placement
    pending: list[PendingPod]
    target: TargetWorkload
    target_name: str
    preemptions: int
    synced: bool


READ_TRIES = 3  # a read that saw the ledger rebuilt while it went through the pods is made again


def _read(state: ClusterState) -> _Reading:
    """Under the cache's lock only what a bind changes: the free column and the list of pods (copies,
    under a millisecond at 10,000 pods). Each pod's placements are read after: they move only when the
    ledger is rebuilt (then the read is made again) or when a preemption's what-if gives a victim's
    slices back and holds them again, on the same GPUs."""
    cache = state.cache
    for _ in range(READ_TRIES):
        with cache.lock:
            built = cache.ledgered()
            free_gpu = built.ledger.view.free_gpu_milli.copy()
            pods = list(cache.pods.values())
            pending = list(cache.pending.values())
        # two lists, no pair per pod: allocations the garbage collector would count (10,000 pods)
        holders = [b for b in pods if b.placement is not None]
        placements = [b.placement for b in holders]
        for b in pods:
            if b.extra:
                holders += [b] * len(b.extra)
                placements += b.extra
        with cache.lock:
            if cache.is_current(built):
                break
    if cache.target is not None:
        target, name = cache.target, "operator"
    elif built.targets is not None:
        target, name = built.targets, "bound pods"
    else:
        target, name = WHOLE_GPU_TARGET, "one whole GPU"
    return _Reading(
        built=built,
        nodes=len(built.inventories),
        free_gpu_milli=free_gpu,
        placements=placements,  # type: ignore[arg-type]  # no None: only the holders' placements
        holders=holders,
        pending=pending,
        target=target,
        target_name=name,
        preemptions=state.preemptions,
        synced=state.synced,
    )


def _figures(r: _Reading, now: float) -> tuple[ClusterFigures, GpuTally, np.ndarray]:
    """The figures, their tally, and per GPU whether a pod may land on it (a share's GPU, or in MIG
    mode). The extender's ledger holds no CPU (kube-scheduler's): FGD judges the GPUs alone."""
    ledger = r.built.ledger
    mig = np.zeros_like(r.built.healthy)
    for node, gpu in ledger.mig_gpus:
        mig[node, gpu] = True
    figures, tally = ledger_figures(
        ledger,
        r.nodes,
        [inv.model for inv in r.built.inventories],
        r.placements,
        r.built.healthy,
        r.target,
        mig_gpus=mig,
        free_gpu_milli=r.free_gpu_milli,
        pending=pending_by_reason(((p.code, p.since) for p in r.pending), now),
        preemptions=r.preemptions,
    )
    return figures, tally, r.built.healthy | mig


def cluster_figures(state: ClusterState, history: FragmentationHistory | None = None) -> ClusterFigures:
    """The metrics' figures of the extender's ledger (``observe.cluster_metrics``); a sample into
    ``history`` if given."""
    now = time.time()
    reading = _read(state)
    figures = _figures(reading, now)[0]
    if history is not None:
        history.observe(figures, now)
    return figures


def _percent(milli: float, capacity: int) -> float:
    return 100.0 * milli / capacity if capacity else 0.0


def cluster_view(
    state: ClusterState,
    history: FragmentationHistory | None = None,
    claims: ClaimReader | None = None,
) -> dict[str, Any]:
    """The whole cluster as JSON types (module docstring); a sample into ``history`` if given; the DRA
    claims from ``claims`` if given."""
    now = time.time()
    claim_rows, claims_error = claims.rows() if claims is not None else ([], "")
    r = _read(state)
    f, tally, usable = _figures(r, now)
    if history is not None:
        history.observe(f, now)
    capacity = r.built.ledger.view.gpu_memory_capacity_bytes
    mib = (capacity // MiB).tolist()
    free_mib = (np.where(usable, capacity - tally.allocated_memory_bytes, 0) // MiB).tolist()
    free_milli = tally.unallocated_milli.tolist()  # 0 where no pod may land
    slices: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for k, node, gpu, milli, memory in zip(
        tally.slice_of.tolist(),
        tally.slice_node.tolist(),
        tally.slice_gpu.tolist(),
        tally.slice_milli.tolist(),
        tally.slice_memory_bytes.tolist(),
        strict=True,
    ):
        p, owner = r.placements[k], r.holders[k]
        slices.setdefault((node, gpu), []).append(
            {
                "pod": f"{owner.namespace}/{owner.name}",
                "milli": milli,
                "memory_mib": memory // MiB,
                "mig_profile": p.mig.instance.profile.name if p.mig is not None else None,
                "mig_start": p.mig.instance.start if p.mig is not None else None,
                # the memory slots it spans, of the 8 every MIG GPU in hardware.mig has
                "mig_slots": p.mig.instance.profile.memory_slices if p.mig is not None else None,
            }
        )
    gpu_counts = f.gpus.tolist()
    nodes = []
    for i, (name, model, inv) in enumerate(zip(f.nodes, f.models, r.built.inventories, strict=True)):
        gpus = []
        for gpu in inv.gpus:
            g = gpu.index
            if g >= gpu_counts[i]:
                continue  # past the ledger's GPUs per node
            gpus.append(
                {
                    "index": g,
                    "uuid": gpu.uuid,
                    "healthy": gpu.healthy,
                    "mig": bool(gpu.mig),
                    "milli_free": free_milli[i][g],
                    "memory_mib": mib[i][g],
                    "memory_free_mib": free_mib[i][g],
                    "slices": slices.get((i, g), []),
                }
            )
        capacity_milli = gpu_counts[i] * MILLI_PER_GPU
        nodes.append(
            {
                "name": name,
                "model": model,
                "unallocated_percent": _percent(int(f.unallocated_milli[i]), capacity_milli),
                "fragmentation_percent": _percent(float(f.fragmented_milli[i]), capacity_milli),
                "gpus": gpus,
            }
        )
    total_milli = int(f.capacity_milli.sum())
    return {
        "time": now,
        "synced": r.synced,
        "fragmentation_target": r.target_name,
        "totals": {
            "nodes": r.nodes,
            "gpus": int(f.gpus.sum()),
            "unallocated_percent": _percent(int(f.unallocated_milli.sum()), total_milli),
            "fragmentation_percent": _percent(float(f.fragmented_milli.sum()), total_milli),
            "pending": len(r.pending),
            "preemptions": r.preemptions,
            "capacity_milli": total_milli,
            "allocated_milli": int(f.allocated_milli.sum()),
            "fragmented_milli": float(f.fragmented_milli.sum()),
        },
        "nodes": nodes,
        "pending": [
            {"pod": f"{p.namespace}/{p.name}", "code": p.code, "reason": p.reason, "since": p.since}
            for p in sorted(r.pending, key=lambda p: (p.since, p.namespace, p.name))
        ],
        "claims": claim_rows,
        "claims_error": claims_error,
        "history": history.samples(now) if history is not None else [],
    }
