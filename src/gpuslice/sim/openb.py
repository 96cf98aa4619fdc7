"""The openb experiment of the FGD paper: static packing of an inflated trace, pod by pod.

Per seed (the FGD paper's methodology, matching the artifact's ``core.go``; docs/references.md, "openb"):

1. shuffle the trace's pods;
2. tune up: append pods sampled with replacement until the GPU request would pass 1.3 × capacity;
3. shuffle the node order (ties go to the first node in it, as the artifact's seeded name prefixes do);
4. place pods one at a time; none ever leaves; a pod that fits nowhere is counted as failed and dropped.

After every pod we record arrived GPU milli (failed pods included), allocated GPU milli and the
cluster's fragmentation (Σ_n F_n(M), ``ledger.fragmentation``). The headline figure is the unallocated
GPU % at 100 % arrival, binned the way the artifact's ``merge_alloc_discrete.py`` does.

A trace with MIG (``sim/trace.py``: nodes' ``mig_gpus``, pods' ``mig_profile``) places its MIG pods through
the placer's MIG path; the GPU figures cover the GPUs not in MIG mode, and the MIG pods and the compute
slices their instances hold are reported apart (``sim/cluster_ledger.py``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpuslice.ledger.fragmentation import FragmentationMeasure
from gpuslice.ledger.ledger import Ledger, LedgerView
from gpuslice.ledger.placement import RefusalCode
from gpuslice.policies import PolicyContext, placement_policy
from gpuslice.programs.guard import GuardConfig, guard_faults
from gpuslice.programs.loader import is_policy_path, resolve
from gpuslice.programs.run_isolation import isolated_run
from gpuslice.scheduler.placer import Placer, Unplaced
from gpuslice.sim.cluster_ledger import capacity_pct, cluster_ledger, mig_slices_held, set_aside_milli
from gpuslice.sim.trace import OpenbTrace, TracePod
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

__all__ = ["DEFAULT_TUNE", "ReplayResult", "arrival_order", "replay", "unallocated_pct_at"]

DEFAULT_TUNE = 1.3  # workload inflation to 130 % of cluster GPU capacity (artifact: tune = 1.3)


@dataclass
class ReplayResult:
    """One (trace, policy, seed) run. Arrays have one entry per arrived pod, in arrival order."""

    trace: str
    policy: str
    seed: int
    total_gpu_milli: int
    arrived_gpu_milli: np.ndarray
    allocated_gpu_milli: np.ndarray
    fragmented_gpu_milli: np.ndarray
    failed_pods: int
    wall_seconds: float
    fallbacks: dict[str, int] = field(default_factory=dict)
    # Pods whose placement the default policy made, in part or whole, because this policy faulted, gave
    # advice the mechanism refused, or was detached: a run where this is not 0 is partly the default's.
    fell_back_pods: int = 0
    # Failed pods by why they failed: each one's most common refusal over the nodes (kube-scheduler's
    # first reason) on the cluster at the end of the run, as ``RefusalCode.label``.
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    # MIG (a trace with MIG-mode GPUs only): pods asking for an instance, those that found none, and the
    # compute slices the instances hold at the end of the run, of all the MIG GPUs' slices.
    mig: dict[str, int] | None = None

    @property
    def pods(self) -> int:
        return len(self.arrived_gpu_milli)

    @property
    def arrived_pct(self) -> np.ndarray:
        return capacity_pct(self.arrived_gpu_milli, self.total_gpu_milli)

    @property
    def unallocated_pct(self) -> np.ndarray:
        """Unallocated GPU % after each pod (100 − allocated milli-GPU / capacity)."""
        return 100.0 - capacity_pct(self.allocated_gpu_milli, self.total_gpu_milli)

    @property
    def fragmentation_pct(self) -> np.ndarray:
        """Fragmentation amount after each pod, % of cluster GPU capacity."""
        return capacity_pct(self.fragmented_gpu_milli, self.total_gpu_milli)

    @property
    def fragmentation_rate_pct(self) -> np.ndarray:
        """Fragmentation as % of the GPU capacity still unallocated."""
        idle = self.total_gpu_milli - self.allocated_gpu_milli
        return 100.0 * np.divide(self.fragmented_gpu_milli, idle, out=np.zeros(len(idle)), where=idle > 0)

    def unallocated_pct_at(self, arrival_pct: int = 100) -> float:
        return unallocated_pct_at(
            self.arrived_pct, self.allocated_gpu_milli, self.total_gpu_milli, arrival_pct
        )

    def record(self) -> dict[str, object]:
        """The JSON record of this run (``results.json`` holds a list of these)."""
        return {
            "trace": self.trace,
            "policy": self.policy,
            "seed": self.seed,
            "pods": self.pods,
            "failed_pods": self.failed_pods,
            "failed_by_reason": self.failed_by_reason,
            "unallocated_pct_at_100": round(self.unallocated_pct_at(100), 4),
            "unallocated_pct_at_end": round(float(self.unallocated_pct[-1]), 4),
            "fragmentation_pct_at_100": round(self._at(self.fragmentation_pct, 100), 4),
            "wall_seconds": round(self.wall_seconds, 4),
            "policy_fallbacks": self.fallbacks,
            "fell_back_pods": self.fell_back_pods,
        } | ({"mig": self.mig} if self.mig is not None else {})

    def _at(self, series: np.ndarray, arrival_pct: int) -> float:
        return _binned_mean(np.round(self.arrived_pct), series, arrival_pct)


def top_reason(ledger: Ledger, request: Request) -> str:
    """The label of the refusal most nodes give ``request``, for a request the placer placed nowhere: the
    code of ``Ledger.closest`` (one tie rule for every home: the fit rule's earlier check);
    ``excluded_by_policy`` when the rule let some node take it and the policy's own filter took them
    away."""
    closest = ledger.closest(request)
    return (RefusalCode.EXCLUDED_BY_POLICY if closest is None else closest.code).label


def _binned_mean(bins: np.ndarray, values: np.ndarray, target: int) -> float:
    """Mean of ``values`` whose arrival bin is ``target`` (±1 when that bin is empty), like the artifact."""
    hit = bins == target
    if not hit.any():
        hit = (bins >= target - 1) & (bins <= target + 1)
    if not hit.any():
        return float("nan")
    return float(values[hit].mean())


def unallocated_pct_at(
    arrived_pct: np.ndarray, allocated_gpu_milli: np.ndarray, total_gpu_milli: int, arrival_pct: int = 100
) -> float:
    """Unallocated GPU % at an arrival level: arrivals rounded to whole percent, allocation ratios
    rounded to 0.01 % and averaged within the bin (``merge_alloc_discrete.py`` of the artifact)."""
    allocated = np.round(capacity_pct(allocated_gpu_milli, total_gpu_milli), 2)
    return 100.0 - _binned_mean(np.round(arrived_pct), allocated, arrival_pct)


def arrival_order(trace: OpenbTrace, rng: np.random.Generator, tune: float = DEFAULT_TUNE) -> list[TracePod]:
    """Shuffled pods, then pods sampled with replacement until the request would pass tune × capacity."""
    pods = [trace.pods[i] for i in rng.permutation(len(trace.pods))]
    if not any(p.request.num_gpu for p in trace.pods):
        return pods  # no GPU demand to inflate: sampling could never reach the target
    requested = sum(p.request.total_gpu_milli for p in pods)
    target = tune * trace.total_gpu_milli
    while True:
        pod = trace.pods[int(rng.integers(len(trace.pods)))]
        # The artifact compares with the pod's per-GPU milli but adds its total (tuneUpPods in
        # simulator.go); kept as is, since it decides which sampled pod ends the run.
        if requested + pod.request.gpu_milli > target:
            return pods
        requested += pod.request.total_gpu_milli
        pods.append(pod)


def _fragmentation_series(
    measure: FragmentationMeasure,
    empty: LedgerView,
    changed: np.ndarray,
    gpu_after: np.ndarray,
    cpu_after: np.ndarray,
) -> np.ndarray:
    """Cluster fragmentation after every pod, from the empty cluster and each pod's changed node."""
    node_frag = measure(empty.free_gpu_milli, empty.free_cpu_milli, empty.node_model)
    start = float(node_frag.sum())
    placed = np.flatnonzero(changed >= 0)
    nodes = changed[placed]
    frag_after = measure(gpu_after[placed], cpu_after[placed], empty.node_model[nodes])
    delta = np.zeros(len(changed))
    for j, (node, value) in enumerate(zip(nodes.tolist(), frag_after.tolist(), strict=True)):
        delta[placed[j]] = value - node_frag[node]
        node_frag[node] = value
    return start + np.cumsum(delta)


def replay(
    trace: OpenbTrace,
    policy: str,
    seed: int,
    tune: float = DEFAULT_TUNE,
    progress: Callable[[int, int], None] | None = None,
    guard_config: GuardConfig | None = None,
) -> ReplayResult:
    """Run the experiment once; ``progress(done, total)`` is called every 500 pods if given.
    ``policy`` is a built-in name or a policy file, guarded with ``guard_config`` (default budgets); a
    file's run goes whole to a worker process unless the config says ``isolate=False``
    (``programs/run_isolation.py``)."""
    config = guard_config or GuardConfig(abandon=False)
    if config.isolate and is_policy_path(policy):
        return isolated_run(
            lambda child, relay: replay(trace, policy, seed, tune, relay if progress else None, child),
            config,
            progress,
        )
    started = time.perf_counter()
    workload_seed, policy_seed = np.random.SeedSequence(seed).spawn(2)
    rng = np.random.default_rng(workload_seed)
    arrivals = arrival_order(trace, rng, tune)
    nodes = [trace.nodes[i] for i in rng.permutation(len(trace.nodes))]
    ledger = cluster_ledger(nodes)
    aside = set_aside_milli(ledger)  # MIG-mode GPUs: not in the GPU figures
    target = TargetWorkload.from_requests(p.request for p in trace.pods)
    context = PolicyContext(rng=np.random.default_rng(policy_seed), target=target)
    # a built-in name or a policy file (guarded; its faults join the placer's fallbacks)
    factory = resolve(policy, "placement", placement_policy, config)
    placer = Placer(ledger, factory(ledger.view, context))
    view = ledger.view

    n = len(arrivals)
    arrived = np.empty(n, dtype=np.int64)
    allocated = np.empty(n, dtype=np.int64)
    # The node each pod changed (-1: failed) and that node's state right after; fragmentation is
    # measured for all of them in one batch at the end instead of once per pod.
    changed = np.full(n, -1, dtype=np.int64)
    gpu_after = np.zeros((n, view.free_gpu_milli.shape[1]), dtype=np.int64)
    cpu_after = np.zeros(n, dtype=np.int64)
    arrived_milli = failed = fell_back = seen = mig_pods = mig_failed = 0
    failed_shapes: Counter[Request] = Counter()
    guard = getattr(placer.policy, "guard", None)  # a policy file's; once detached, it counts no more
    for i, pod in enumerate(arrivals):
        arrived_milli += pod.request.total_gpu_milli
        result = placer.place(pod.request, explain=False)
        counted = placer.fallbacks.total() + (guard.faults.total() if guard is not None else 0)
        if counted != seen or (guard is not None and guard.detached):
            fell_back, seen = fell_back + 1, counted
        if pod.request.mig_profile:
            mig_pods += 1
            mig_failed += isinstance(result, Unplaced)
        if isinstance(result, Unplaced):
            failed += 1
            failed_shapes[pod.request] += 1
        else:
            changed[i] = result.node
            gpu_after[i] = view.free_gpu_milli[result.node]
            cpu_after[i] = view.free_cpu_milli[result.node]
        arrived[i] = arrived_milli
        allocated[i] = ledger.allocated_gpu_milli - aside
        if progress is not None and (i + 1) % 500 == 0:
            progress(i + 1, n)
    if progress is not None:
        progress(n, n)
    # Judged on the full cluster at the end: no pod ever leaves, so a pod that failed still fails there
    # (and a shape is judged once, not once per failed pod).
    failed_by: Counter[str] = Counter()
    for request, count in failed_shapes.items():
        failed_by[top_reason(ledger, request)] += count
    fragmented = _fragmentation_series(
        FragmentationMeasure(target, ledger.models), cluster_ledger(nodes).view, changed, gpu_after, cpu_after
    )
    mig = None
    if ledger.mig_gpus:
        held, slices = mig_slices_held(ledger)
        mig = {"pods": mig_pods, "failed_pods": mig_failed, "slices_held": held, "slices": slices}
    return ReplayResult(
        trace=trace.name,
        policy=policy,
        seed=seed,
        total_gpu_milli=ledger.total_gpu_milli - aside,
        arrived_gpu_milli=arrived,
        allocated_gpu_milli=allocated,
        fragmented_gpu_milli=fragmented,
        failed_pods=failed,
        failed_by_reason=dict(failed_by.most_common()),
        wall_seconds=time.perf_counter() - started,
        fallbacks={
            **{f"{hook}:{reason}": c for (hook, reason), c in placer.fallbacks.items()},
            **guard_faults(placer.policy),  # a policy file's faults
        },
        fell_back_pods=fell_back,
        mig=mig,
    )
