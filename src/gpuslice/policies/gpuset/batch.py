"""Batch assignment: several multi-GPU jobs waiting on one machine get disjoint GPU sets, chosen jointly.

One job at a time, the best set for the first job can leave the next one only poorly linked GPUs; a joint
choice trades a little for one job against a lot for another. The cost of giving job j the set S is

    cost(j, S) = α · latency(S) + β · bandwidth(S) + γ · balance(S)

- latency: hop distance summed over every pair of S (``Topology.hop_cost``: same GPU 0, NVLink 1,
  NVSwitch 2, PCIe only 3; the topology's ``CostModel``);
- bandwidth: the link time the job's ring all-reduce uses, relative to the machine's best pair:
  2(k−1)/k · B_best / B_min(S), B_min the bottleneck of the best ring through S and B_best the fastest
  pair of the machine (a ring all-reduce of S bytes takes 2(k−1)/k · S / B_min; 1 = two GPUs on the
  fastest pair), so this term is proportional to the modelled all-reduce time;
- balance: after taking S, the busy GPUs of the most loaded NUMA node minus those of the least loaded
  (0 where NUMA is unknown): a tie-breaker that keeps host-side traffic spread over the sockets.

Defaults (``CostWeights``): α = 1 per hop, β = 4 per unit of relative all-reduce time, γ = 0.25 per GPU
of imbalance; ours, chosen so that bandwidth decides on NVLink meshes and PCIe trees, hops next, balance
last.

Candidates: per job, every k-set of the free GPUs it may use that meets its topology need, ranked by the
exact search's ranking (``Exact.cost``: ring bandwidth, hops, NUMA span) and cut to the best
``top_n`` (default 16). When the cut leaves a job waiting, the search is run again with every set, so the
cut never costs a job its start.

Solver: ``scipy.optimize.linear_sum_assignment`` (the Hungarian method) on the job × candidate-set matrix,
with one "wait" column per job (a penalty larger than any real cost, so as many jobs as possible start,
earlier jobs in the given order first, then the lowest cost). The Hungarian method gives each job a
different column but not disjoint GPU sets, so it is used as the bound of a branch and bound: solve;
if the chosen sets are disjoint the solution is optimal for that branch; otherwise take the first job
whose set overlaps another's and branch on every set it can still have (and on waiting), GPUs taken by
the fixed jobs removed, pruning a branch whose Hungarian bound is no better than the best found. The
relaxation is a lower bound of every branch, so the result is the optimum over the candidates (at
machine scale a few dozen solves; ``MAX_SOLVES`` bounds a pathological batch, and ``optimal`` says
whether the bound was reached).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from gpuslice.hardware.topology import Topology, mask_of
from gpuslice.policies.gpuset.exact import Exact
from gpuslice.policies.gpuset.pick import meets_need
from gpuslice.workload.job import TopologyNeed

__all__ = [
    "DEFAULT_TOP_N",
    "MAX_BATCH",
    "MAX_SOLVES",
    "BatchAssignment",
    "BatchJob",
    "CostWeights",
    "SetCost",
    "assign_batch",
    "candidate_sets",
    "first_of_batch",
    "set_cost",
]

DEFAULT_TOP_N = 16  # candidate sets per job, best first by the exact ranking
MAX_SOLVES = 20_000  # Hungarian solves per batch before the best assignment found so far is returned
MAX_BATCH = 8  # jobs a home assigns together at most (an 8-GPU machine holds at most four 2-GPU jobs)


@dataclass(frozen=True, slots=True)
class CostWeights:
    """α, β, γ of the module docstring; every one overridable."""

    alpha: float = 1.0  # per hop
    beta: float = 4.0  # per unit of relative all-reduce time
    gamma: float = 0.25  # per GPU of NUMA imbalance


@dataclass(frozen=True, slots=True)
class BatchJob:
    """A waiting job: ``k`` GPUs meeting ``need``, from ``eligible`` (None: any free GPU)."""

    name: str
    k: int
    need: TopologyNeed = TopologyNeed.ANY
    eligible: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class SetCost:
    """The cost terms of one set, unweighted, and the weighted total."""

    gpus: tuple[int, ...]
    latency: float
    bandwidth: float
    balance: float
    total: float


@dataclass(frozen=True)
class BatchAssignment:
    """Per job (in the order given): its set and cost, or None and why it waits."""

    jobs: tuple[BatchJob, ...]
    sets: tuple[SetCost | None, ...]
    reasons: dict[str, str] = field(default_factory=dict)
    optimal: bool = True
    solves: int = 0

    @property
    def total(self) -> float:
        return sum(s.total for s in self.sets if s is not None)

    def gpus_of(self, name: str) -> tuple[int, ...] | None:
        for job, s in zip(self.jobs, self.sets, strict=True):
            if job.name == name:
                return None if s is None else s.gpus
        raise KeyError(name)


def set_cost(
    topology: Topology,
    free: Collection[int],
    gpus: Sequence[int],
    weights: CostWeights,
    best_pair_gbps: float | None = None,
) -> SetCost:
    """The cost of taking ``gpus`` out of ``free`` on ``topology``; ``best_pair_gbps``, the machine's
    fastest pair, is computed when not given."""
    gpus = tuple(sorted(int(g) for g in gpus))
    latency = topology.hop_cost(gpus) if len(gpus) > 1 else 0.0
    bandwidth = 0.0
    if len(gpus) > 1:
        best = best_pair_gbps if best_pair_gbps is not None else _best_pair_gbps(topology)
        k = len(gpus)
        bandwidth = 2 * (k - 1) / k * best / topology.ring_bandwidth(gpus)
    busy = set(range(topology.n_gpus)) - set(free) | set(gpus)
    balance = 0.0
    nodes = sorted({n for n in topology.numa if n >= 0})
    if len(nodes) > 1:
        counts = [sum(1 for g in busy if topology.numa[g] == n) for n in nodes]
        balance = float(max(counts) - min(counts))
    total = weights.alpha * latency + weights.beta * bandwidth + weights.gamma * balance
    return SetCost(gpus, latency, bandwidth, balance, round(total, 9))


def candidate_sets(
    topology: Topology, free: Collection[int], job: BatchJob, top_n: int | None = DEFAULT_TOP_N
) -> list[tuple[int, ...]]:
    """The job's candidate sets, best first by ``Exact.cost`` then index; all of them when top_n is None."""
    pool = sorted({int(g) for g in free} & (set(job.eligible) if job.eligible is not None else set(free)))
    if job.k < 1 or len(pool) < job.k:
        return []
    sets = [s for s in combinations(pool, job.k) if meets_need(topology, s, job.need)]
    sets.sort(key=lambda s: (Exact.cost(topology, s), s))
    return sets if top_n is None else sets[:top_n]


def assign_batch(
    topology: Topology,
    free: Collection[int],
    jobs: Sequence[BatchJob],
    *,
    weights: CostWeights = CostWeights(),
    top_n: int | None = DEFAULT_TOP_N,
) -> BatchAssignment:
    """Disjoint GPU sets for ``jobs`` out of ``free`` (see the module docstring); never a GPU twice."""
    free = sorted({int(g) for g in free})
    result = _assign(topology, free, tuple(jobs), weights, top_n)
    if top_n is not None and any(s is None for s in result.sets):
        wider = _assign(topology, free, tuple(jobs), weights, None)
        if sum(s is not None for s in wider.sets) > sum(s is not None for s in result.sets):
            return wider
    return result


def first_of_batch(
    topology: Topology, free: Collection[int], first: BatchJob, later: Sequence[BatchJob]
) -> tuple[int, ...] | None:
    """How a home asks: the set the joint assignment gives ``first`` (the job being placed now) when the
    ``later`` jobs of 2 or more GPUs join, in order, while their GPU counts together still fit the free
    GPUs ``first`` may use (at most ``MAX_BATCH`` jobs). None when no later job joins (the one-job choice
    is the home's default then) or ``first`` gets no set."""
    usable = [g for g in free if first.eligible is None or g in first.eligible]
    room = len(usable) - first.k
    jobs = [first]
    for job in later:
        if len(jobs) >= MAX_BATCH:
            break
        if job.k >= 2 and job.k <= room:
            jobs.append(job)
            room -= job.k
    if len(jobs) < 2:
        return None
    named = [BatchJob(f"{i}", j.k, j.need, j.eligible) for i, j in enumerate(jobs)]
    return assign_batch(topology, free, named).gpus_of("0")


def _assign(
    topology: Topology, free: list[int], jobs: tuple[BatchJob, ...], weights: CostWeights, top_n: int | None
) -> BatchAssignment:
    options: list[list[tuple[int, SetCost]]] = []
    best = _best_pair_gbps(topology)
    for job in jobs:
        sets = candidate_sets(topology, free, job, top_n)
        options.append([(mask_of(s), set_cost(topology, free, s, weights, best)) for s in sets])
    search = _Search(options)
    chosen = search.run()
    sets = tuple(None if c is None else options[j][c][1] for j, c in enumerate(chosen))
    reasons = {
        job.name: _why_waiting(topology, free, job, bool(options[j]))
        for j, job in enumerate(jobs)
        if sets[j] is None
    }
    return BatchAssignment(jobs, sets, reasons, optimal=not search.cut, solves=search.solves)


def _why_waiting(topology: Topology, free: list[int], job: BatchJob, had_sets: bool) -> str:
    if had_sets:
        return f"needs {job.k} GPU(s); every set it could have overlaps GPUs given to other jobs of the batch"
    usable = [g for g in free if job.eligible is None or g in job.eligible]
    if len(usable) < job.k:
        return f"needs {job.k} GPU(s); only {len(usable)} free that it may use"
    return f"needs {job.k} GPU(s) with topology {job.need.value}; no such set among GPU {usable}"


class _Search:
    """Branch and bound over the jobs' options, the Hungarian relaxation as the bound."""

    def __init__(self, options: list[list[tuple[int, SetCost]]]) -> None:
        self.options = options
        n = len(options)
        real = sum(max((c.total for _, c in opts), default=0.0) for opts in options) + 1.0
        # wait penalty of job j: more than all real costs, and more for earlier jobs; one more job started
        # always beats any change in who waits or what the sets cost
        self.wait = [(n * n + 1) * real + (n - j) * real for j in range(n)]
        self.forbid = 10.0 * sum(self.wait) + 1.0
        self.best_cost = np.inf
        self.best: list[int | None] = [None] * n
        self.solves = 0
        self.cut = False

    def run(self) -> list[int | None]:
        if self.options:
            self._branch({}, 0, 0.0)
        return self.best

    def _branch(self, fixed: dict[int, int | None], used: int, fixed_cost: float) -> None:
        if self.solves >= MAX_SOLVES:
            self.cut = True
            return
        rest = [j for j in range(len(self.options)) if j not in fixed]
        if not rest:
            if fixed_cost < self.best_cost:
                self.best_cost, self.best = fixed_cost, [fixed[j] for j in range(len(self.options))]
            return
        open_ = {j: [i for i, (m, _) in enumerate(self.options[j]) if not m & used] for j in rest}
        masks = sorted({self.options[j][i][0] for j in rest for i in open_[j]})
        col = {m: c for c, m in enumerate(masks)}
        matrix = np.full((len(rest), len(masks) + len(rest)), self.forbid)
        for r, j in enumerate(rest):
            for i in open_[j]:
                m, cost = self.options[j][i]
                matrix[r, col[m]] = min(matrix[r, col[m]], cost.total)
            matrix[r, len(masks) + r] = self.wait[j]
        # imported here: scipy.optimize costs ~0.6 s to import, which every CLI command would pay
        from scipy.optimize import linear_sum_assignment

        rows, cols = linear_sum_assignment(matrix)
        self.solves += 1
        bound = fixed_cost + float(matrix[rows, cols].sum())
        if bound >= self.best_cost - 1e-9:
            return
        picked: dict[int, int | None] = {}
        for r, c in zip(rows, cols, strict=True):
            j = rest[r]
            picked[j] = (
                None if c >= len(masks) else next(i for i in open_[j] if self.options[j][i][0] == masks[c])
            )
        conflict = self._first_conflict(picked)
        if conflict is None:
            self.best_cost, self.best = bound, [{**fixed, **picked}[j] for j in range(len(self.options))]
            return
        # branch on the conflicting job: the set the relaxation gave it first, then the others by cost
        first = picked[conflict]
        order = sorted(open_[conflict], key=lambda i: (i != first, self.options[conflict][i][1].total, i))
        for i in order:
            m, cost = self.options[conflict][i]
            self._branch({**fixed, conflict: i}, used | m, fixed_cost + cost.total)
        self._branch({**fixed, conflict: None}, used, fixed_cost + self.wait[conflict])

    def _first_conflict(self, picked: dict[int, int | None]) -> int | None:
        """The first job (in order) whose picked set overlaps another picked set; None if all disjoint."""
        seen = 0
        holders: list[tuple[int, int]] = []
        for j in sorted(picked):
            i = picked[j]
            if i is None:
                continue
            m = self.options[j][i][0]
            if m & seen:
                return next(h for h, hm in holders if hm & m)
            seen |= m
            holders.append((j, m))
        return None


def _best_pair_gbps(topology: Topology) -> float:
    bw = topology.pair_bandwidth_gbps()
    return float(bw[np.isfinite(bw)].max()) if topology.n_gpus > 1 else 1.0
