"""Assign a batch of single-GPU tasks to the GPUs of one machine at once, with the Hungarian algorithm.

Each task may talk to GPUs that already run its peers (``peers``: the other ranks, a parameter server),
may move data at some rate (``bandwidth_gbps``) and adds load. The cost of task t on GPU g, in slot s
(slot s = the (s+1)-th task of this batch on that GPU), is

    α · communication  +  β · bandwidth use  +  γ · load imbalance

- communication: mean hop distance from g to t's peers under the topology's cost model, divided by the
  PCIe hop cost so it lies in 0…1 (research k8s_nvidia_reference.md §5 link classes); 0 without peers;
- bandwidth use: t's rate over the slowest link from g to its peers (the host PCIe link without peers),
  i.e. the fraction of that link the task would fill (§6 bandwidths); > 1 means it would saturate it;
- load imbalance: |load of g after t − the level every GPU would have if the whole batch were spread
  evenly|. Slot s assumes the s tasks before it on g carry t's own load, an approximation that keeps the
  problem a plain assignment (exact when tasks of a batch have equal load, the usual case).

``scipy.optimize.linear_sum_assignment`` minimises the total over tasks × (GPU, slot) columns exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from gpuslice.errors import UserError
from gpuslice.hardware.topology import Topology

__all__ = ["AssignWeights", "BatchAssignment", "BatchTask", "ImpossibleBatch", "assign_batch", "cost_matrix"]


class ImpossibleBatch(UserError):
    """A batch cannot be assigned: too many tasks, unknown GPUs, bad weights, or allowed sets that clash."""


@dataclass(frozen=True, slots=True)
class BatchTask:
    """One task of a batch; it needs one GPU (or one slot of a GPU)."""

    name: str
    peers: tuple[int, ...] = ()  # GPUs it exchanges data with
    bandwidth_gbps: float = 0.0  # GB/s per direction it moves to its peers (or the host)
    load: float = 1.0  # what it adds to a GPU's load, e.g. 1.0 = one busy GPU
    allowed: tuple[int, ...] | None = None  # GPUs it may use; None = any


@dataclass(frozen=True, slots=True)
class AssignWeights:
    """α, β, γ of the cost; each ≥ 0. Defaults weigh the three normalised terms equally."""

    alpha: float = 1.0  # communication
    beta: float = 1.0  # bandwidth use
    gamma: float = 1.0  # load imbalance


@dataclass(frozen=True, slots=True)
class BatchAssignment:
    """Per task (in batch order) its GPU and its cost; ``total_cost`` is the sum the solver minimised."""

    gpus: tuple[int, ...]
    costs: tuple[float, ...]
    total_cost: float


def _validate(
    topology: Topology, tasks: Sequence[BatchTask], load: np.ndarray, weights: AssignWeights, slots: int
) -> None:
    n = topology.n_gpus
    for label, w in (("alpha", weights.alpha), ("beta", weights.beta), ("gamma", weights.gamma)):
        if not math.isfinite(w) or w < 0:
            raise ImpossibleBatch(f"weight {label}={w}: weights must be finite and ≥ 0")
    if slots < 1:
        raise ImpossibleBatch(f"slots_per_gpu={slots}: a GPU takes at least 1 task")
    if load.shape != (n,) or not np.all(np.isfinite(load)) or np.any(load < 0):
        raise ImpossibleBatch(f"gpu_load needs {n} finite values ≥ 0, one per GPU of {topology.name}")
    if len(tasks) > n * slots:
        raise ImpossibleBatch(
            f"{len(tasks)} tasks but {topology.name} has {n} GPUs × {slots} slot(s); "
            "raise slots_per_gpu or split the batch"
        )
    for t in tasks:
        for g in (*t.peers, *(t.allowed or ())):
            if not 0 <= g < n:
                raise ImpossibleBatch(f"task {t.name!r} names GPU {g}; {topology.name} has GPUs 0–{n - 1}")
        if t.allowed is not None and not t.allowed:
            raise ImpossibleBatch(f"task {t.name!r} allows no GPU; give at least one or None for any")
        if not (math.isfinite(t.bandwidth_gbps) and t.bandwidth_gbps >= 0 and math.isfinite(t.load)):
            raise ImpossibleBatch(f"task {t.name!r}: bandwidth and load must be finite, bandwidth ≥ 0")


def cost_matrix(
    topology: Topology,
    tasks: Sequence[BatchTask],
    gpu_load: Sequence[float] | None = None,
    weights: AssignWeights | None = None,
    slots_per_gpu: int = 1,
) -> np.ndarray:
    """tasks × (GPUs · slots) costs, column c = GPU c % n in slot c // n; inf where a task may not go."""
    n = topology.n_gpus
    weights = weights or AssignWeights()
    load = np.zeros(n) if gpu_load is None else np.asarray(gpu_load, dtype=float)
    _validate(topology, tasks, load, weights, slots_per_gpu)
    hops = topology.hops() / topology.cost_model.pcie
    bw = topology.pair_bandwidth_gbps()
    level = (load.sum() + sum(t.load for t in tasks)) / n
    cost = np.empty((len(tasks), n * slots_per_gpu))
    for row, t in enumerate(tasks):
        peers = list(t.peers)
        comm = hops[:, peers].mean(axis=1) if peers else np.zeros(n)
        link = bw[:, peers].min(axis=1) if peers else np.full(n, topology.bandwidth_model.pcie_gbps)
        use = t.bandwidth_gbps / link  # inf link (the peer's own GPU) → 0
        for slot in range(slots_per_gpu):
            imbalance = np.abs(load + (slot + 1) * t.load - level)
            cost[row, slot * n : (slot + 1) * n] = (
                weights.alpha * comm + weights.beta * use + weights.gamma * imbalance
            )
        if t.allowed is not None:
            banned = np.setdiff1d(np.arange(n), t.allowed)
            for slot in range(slots_per_gpu):
                cost[row, slot * n + banned] = np.inf
    return cost


def assign_batch(
    topology: Topology,
    tasks: Sequence[BatchTask],
    gpu_load: Sequence[float] | None = None,
    weights: AssignWeights | None = None,
    slots_per_gpu: int = 1,
) -> BatchAssignment:
    """The minimum-cost assignment of every task to a GPU; ImpossibleBatch says why there is none."""
    if not tasks:
        return BatchAssignment(gpus=(), costs=(), total_cost=0.0)
    cost = cost_matrix(topology, tasks, gpu_load, weights, slots_per_gpu)
    try:
        rows, cols = linear_sum_assignment(cost)
    except ValueError:  # scipy: "cost matrix is infeasible" when the allowed sets cannot all be met
        limited = ", ".join(f"{t.name!r} → {list(t.allowed)}" for t in tasks if t.allowed is not None)
        raise ImpossibleBatch(
            f"no assignment gives every task an allowed GPU with {slots_per_gpu} slot(s) per GPU "
            f"(restricted tasks: {limited}); widen their allowed GPUs or raise slots_per_gpu"
        ) from None
    order = np.argsort(rows)
    gpus = tuple(int(c % topology.n_gpus) for c in cols[order])
    costs = tuple(float(cost[r, c]) for r, c in zip(rows[order], cols[order], strict=True))
    return BatchAssignment(gpus=gpus, costs=costs, total_cost=float(sum(costs)))
