"""The timed replay: pods arrive, wait in serve's queue, run on the Placer's choice, and leave.

An event-driven loop over a virtual clock. At each instant where something happens (arrivals at
``creation_time / load``, ends at start + duration, preempted pods stopping after their grace), ends
are applied first, then arrivals, then one scheduling pass, the node scheduler's (``NodeScheduler.step``)
over the whole cluster:

```text
walk = pending in order_pending's order                 following the view after every start (tenant
                                                       usage moved): kept, merged or sorted (pending_order)
for job in walk:
    a head is blocked and backfill is off              -> everyone after it waits
    Placer.place(request) over the cluster             the same Placer and placement policy as sim openb,
                                                       serve and the extender
        nowhere -> the first such job is the head: preemption victims (preemption.find_preemption, one
                   node at a time) and its EASY reservation (backfill.shadow)
        placed  -> would it delay the head's reservation? (backfill.allows) -> undo, it waits
                   else it runs until now + duration
```

A shape that found no room stays without room until something is released, so it is not asked again in
between (the node scheduler's per-pass ``failed`` set, kept across passes until a release). Pods that
fit no node of the empty cluster never start and are counted as such; so are pods still waiting when
no event is left (a head that can never start under a strict queue). Preempted pods go back to the
queue and run their whole duration again (the trace has no checkpoints); their JCT counts from their
first arrival. The queue policy's aging is evaluated at event times only (serve steps every second).

MIG (a trace with ``mig_gpus`` and ``mig_profile``, ``sim/trace.py``): a MIG pod waits, starts, is
preempted and backfilled like any other, its instance chosen by the placer's MIG path and its room in
what-ifs judged on copies of the MIG GPUs' layouts (``queue_adapter.ClusterCapacity``); the GPU figures
cover the GPUs not in MIG mode (``sim/cluster_ledger.py``).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpuslice.hardware.topology import Topology
from gpuslice.hardware.topology_profiles import profile
from gpuslice.ledger.fragmentation import FragmentationMeasure
from gpuslice.ledger.placement import Placement
from gpuslice.policies import PolicyContext, placement_policy
from gpuslice.policies.queue import QueuedJob, QueueOps, QueueView, effective_priority
from gpuslice.policies.queue import queue_policy as lookup_queue_policy
from gpuslice.programs.guard import GuardConfig, guard_faults
from gpuslice.programs.loader import is_policy_path, resolve
from gpuslice.programs.run_isolation import isolated_run
from gpuslice.scheduler.backfill import Shadow
from gpuslice.scheduler.node_fit import gpus_equivalent
from gpuslice.scheduler.placer import Placer, Unplaced, wants_gpu_set
from gpuslice.sim.cluster_ledger import cluster_ledger, set_aside_milli
from gpuslice.sim.pending_order import PendingOrder
from gpuslice.sim.queue_adapter import (
    ClusterHolding,
    RunningPod,
    cheapest_victims,
    job_spec,
    may_backfill,
    reservation,
)
from gpuslice.sim.timed_metrics import PodArrays, SampleLog, TimedResult
from gpuslice.sim.timed_trace import TimedJob, TimedTrace
from gpuslice.workload.job import DEFAULT_GRACE_SECONDS, JobSpec
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

__all__ = ["FRAGMENTATION_SAMPLES", "ReplayConfig", "replay_timed"]

FRAGMENTATION_SAMPLES = 100  # fragmentation is measured at this many evenly spaced instants


@dataclass(frozen=True)
class ReplayConfig:
    """One replay's settings. ``estimates`` (one per trace job, or None for none) is what each pod
    declares as its run time: what SJF orders by and EASY reserves with."""

    placement: str
    queue: str
    backfill: bool
    load: float = 1.0
    seed: int = 42
    aging_seconds: float = 600.0
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    label: str = ""
    # A machine profile (hardware/topology_profiles.py) wired into every node with its GPU count: there,
    # multi-GPU pods that arrive at the same instant get their GPU sets jointly (policies/gpuset/batch.py).
    topology: str | None = None


@dataclass(slots=True)
class _Pod:
    """What the replay reads of a pod while it is in the system (made at arrival, dropped at its end)."""

    request: Request
    spec: JobSpec
    shape: int
    duration: float


@dataclass
class _Running:
    index: int
    pod: RunningPod
    token: int
    started_at: float


class _Replay:
    def __init__(
        self,
        trace: TimedTrace,
        config: ReplayConfig,
        estimates: Sequence[float] | None,
        guard_config: GuardConfig | None = None,
    ) -> None:
        if not config.load > 0 or not math.isfinite(config.load):
            raise ValueError("load must be a positive finite number")
        self.trace, self.config, self.estimates = trace, config, estimates
        self.jobs = trace.jobs  # only iterated (a stream makes each pod as it is read), never kept
        n = len(self.jobs)
        policy_seed = np.random.SeedSequence(config.seed)
        self.ledger = cluster_ledger(trace.nodes)  # MIG-mode GPUs set aside for MIG pods' instances
        self.empty = cluster_ledger(trace.nodes)
        self.aside = set_aside_milli(self.ledger)  # not in the GPU figures (sim/cluster_ledger.py)
        self.target = TargetWorkload.from_requests(j.request for j in self.jobs)
        context = PolicyContext(rng=np.random.default_rng(policy_seed), target=self.target)
        factory = resolve(config.placement, "placement", placement_policy, guard_config)
        self.placer = Placer(
            self.ledger, factory(self.ledger.view, context), topologies=_wiring(trace, config)
        )
        self.queue: QueueOps = resolve(config.queue, "queue", lookup_queue_policy, guard_config)()
        self.live: dict[int, _Pod] = {}  # pods from their arrival to their end
        self.fallbacks: Counter[str] = Counter()
        self.pods = PodArrays(n)
        self.pending = PendingOrder(self.queue, self.fallbacks)
        self.queued_since: dict[int, float] = {}
        self.fresh: dict[int, None] = {}  # pods queued at ``fresh_at``, in the order they were
        self.fresh_at = math.nan
        self.running: dict[int, _Running] = {}
        self.usage: dict[str, float] = {}
        self.events: list[tuple[float, int, int, int, bool]] = []  # (time, seq, job, token, is a stop)
        self.seq = 0
        self.shapes: dict[Request, int] = {}  # each distinct request once: sets of ints hash fast
        self.unfit: set[int] = set()  # shapes that found no room since the last release
        self.homes: dict[Request, frozenset[int]] = {}  # nodes that can take the shape when empty
        self.releases = 0  # releases so far: a blocked head asks for victims again only after one
        self.asked: tuple[int, int] | None = None  # (head, releases) of the last victim search
        # The head's EASY reservation stays valid (backfill.allows keeps it up to date) until the head
        # changes, something is released or preempted, or a job starts ahead of the head.
        self.starts_ahead = 0
        self.shadow_key: tuple[int, int, int, int] | None = None
        self.shadow: Shadow | None = None
        self.in_grace: dict[int, int] = {}  # victim index -> the head index it makes room for
        self.preemptions = 0
        self.samples = SampleLog()  # (time, allocated milli, pending, running), bounded
        self.fragmentation: list[tuple[float, float]] = []
        self.measure = FragmentationMeasure(self.target, self.ledger.models)

    # ---- the loop ------------------------------------------------------------------------------------

    def run(self, progress: Callable[[int, int], None] | None) -> None:
        n, a, told, load = len(self.jobs), 0, 0, self.config.load
        # Fragmentation: evenly spaced over the arrivals, then at geometrically growing steps through
        # the tail of long pods (the measure costs a pass over every node).
        first = self.jobs[0].arrival / load if n else 0.0
        last_arrival = self.jobs[-1].arrival / load if n else 0.0
        span = last_arrival - first
        frag_step = span / FRAGMENTATION_SAMPLES if span > 0 else math.inf
        next_frag = first if n else math.inf
        stream = iter(self.jobs)
        job = next(stream, None)
        arrival = job.arrival / load if job is not None else math.inf
        while job is not None or self.events:
            now = min(arrival, self.events[0][0] if self.events else math.inf)
            while next_frag <= now:  # the state held from the last event until now
                self._measure_fragmentation(next_frag)
                next_frag += frag_step
                if next_frag > last_arrival:
                    frag_step *= 1.5
            while self.events and self.events[0][0] <= now:
                _, _, index, token, stop = heapq.heappop(self.events)
                self._ended(index, token, stop, now)
            while job is not None and arrival <= now:
                self._arrive(a, job, now)
                a += 1
                job = next(stream, None)
                arrival = job.arrival / load if job is not None else math.inf
            self._step(now)
            allocated = self.ledger.allocated_gpu_milli - self.aside
            self.samples.add(now, allocated, len(self.pending), len(self.running))
            if progress is not None and a - told >= 1000:  # several pods may arrive in one step
                progress(a, n)
                told = a
        if progress is not None:
            progress(n, n)

    def _push(self, at: float, index: int, token: int, stop: bool = False) -> None:
        heapq.heappush(self.events, (at, self.seq, index, token, stop))
        self.seq += 1

    def _arrive(self, index: int, job: TimedJob, now: float) -> None:
        self.pods.arrived(index, job, now)
        req = job.request
        if not self._homes(req):
            self.pods.never_fits[index] = True
            return
        estimate = None if self.estimates is None else float(self.estimates[index])
        shape = self.shapes.setdefault(req, len(self.shapes))
        self.live[index] = _Pod(req, job_spec(str(index), req, job.qos, estimate), shape, job.duration)
        self._enqueue(index, now)

    def _enqueue(self, index: int, now: float) -> None:
        spec = self.live[index].spec
        self.pending.add(index, QueuedJob(str(index), spec, now, self.seq), self._view(now))
        self.queued_since[index] = now
        if self.fresh_at != now:
            self.fresh_at, self.fresh = now, {}
        self.fresh[index] = None
        self.seq += 1

    def _ended(self, index: int, token: int, stop: bool, now: float) -> None:
        """A pod's end, or the end of a preempted pod's grace, whichever comes first."""
        run = self.running.get(index)
        if run is None or run.token != token:
            return  # the other of the two came first
        self._release(index, run, now)
        preempted = self.in_grace.pop(index, None) is not None
        if stop and preempted:  # stopped before it finished: back to the queue, its work lost
            self.pods.preempted[index] += 1
            self._enqueue(index, now)
        else:
            self.pods.end[index] = now
            del self.live[index]

    def _release(self, index: int, run: _Running, now: float) -> None:
        del self.running[index]
        placement = run.pod.holding.placement
        self.placer.release(placement)
        spec = self.live[index].spec
        self.usage[spec.tenant] -= gpus_equivalent(run.pod.holding, 0)  # type: ignore[arg-type]
        self.unfit.clear()
        self.releases += 1
        self.queue.on_finished(self._view(now), QueuedJob(str(index), spec, run.started_at, run.token))

    # ---- one pass ------------------------------------------------------------------------------------

    def _view(self, now: float) -> QueueView:
        return QueueView(now, self.config.aging_seconds, {}, self.usage)

    def _step(self, now: float) -> None:
        if not self.pending:
            return
        walk = self.pending.walk(self._view(now))
        arrived = self._arrived_together(now)
        head: QueuedJob | None = None
        shadow = None
        for job in walk:
            if head is not None and not self.config.backfill:
                return  # a strict queue: nobody passes the blocked head
            index = int(job.job_id)
            pod = self.live[index]
            req, shape = pod.request, pod.shape
            together: list[Request] = []
            if arrived.pop(index, None) is not None and len(arrived):
                together = [self.live[int(j.job_id)].request for j in walk.after(arrived.values())]
            placed = None if shape in self.unfit else self.placer.place(req, explain=False, later=together)
            if placed is None or isinstance(placed, Unplaced):
                self.unfit.add(shape)
                if head is None:
                    head = job
                    self._preempt_for(index, job, now)
                    if self.config.backfill:
                        shadow = self._reservation(index, req)
                continue
            if head is not None:
                runtime = job.spec.max_runtime_seconds
                end = now + runtime if runtime is not None else math.inf
                if not may_backfill(shadow, placed, end):
                    self.placer.release(placed)
                    continue
            if head is None:
                self.starts_ahead += 1
            self._start(index, job, placed, now)
            walk.started()

    def _arrived_together(self, now: float) -> dict[int, QueuedJob]:
        """Multi-GPU pods queued at ``now`` and still pending, when two or more are and nodes have
        wiring: the pods of this instant only, kept as they enqueue (``_enqueue``)."""
        if self.placer.topologies is None or self.fresh_at != now:
            return {}
        arrived = {
            i: self.pending.jobs[i]
            for i in self.fresh
            if i in self.pending and wants_gpu_set(self.live[i].request)
        }
        return arrived if len(arrived) >= 2 else {}

    def _reservation(self, index: int, req: Request) -> Shadow | None:
        key = (index, self.releases, self.starts_ahead, self.preemptions)
        if key != self.shadow_key:
            self.shadow_key, self.shadow = key, reservation(self.ledger, req, self._running_pods(req))
        return self.shadow

    def _homes(self, req: Request) -> frozenset[int]:
        homes = self.homes.get(req)
        if homes is None:
            homes = self.homes[req] = frozenset(np.flatnonzero(self.empty.fits(req)).tolist())
        return homes

    def _running_pods(self, req: Request) -> list[RunningPod]:
        """Running pods in start order on the nodes that could ever take ``req``: releases elsewhere
        cannot make room for it, so they change neither its reservation nor its victims."""
        homes = self._homes(req)
        return [r.pod for r in self.running.values() if r.pod.holding.placement.node in homes]

    def _start(self, index: int, job: QueuedJob, placement: Placement, now: float) -> None:
        self.pending.remove(index)
        self.pods.waited[index] += now - self.queued_since.pop(index)
        if math.isnan(self.pods.start[index]):
            self.pods.start[index] = now
        spec = self.live[index].spec
        runtime = spec.max_runtime_seconds
        holding = ClusterHolding(placement)
        pod = RunningPod(
            job.job_id,
            holding,
            int(spec.priority),
            now,
            now + runtime if runtime is not None else math.inf,
            spec.preemptible,
        )
        self.running[index] = _Running(index, pod, self.seq, now)
        self.usage[spec.tenant] = self.usage.get(spec.tenant, 0.0) + gpus_equivalent(holding, 0)  # type: ignore[arg-type]
        self._push(now + self.live[index].duration, index, self.seq)
        self.queue.on_started(self._view(now), job)

    def _preempt_for(self, index: int, job: QueuedJob, now: float) -> None:
        """The head job asks for victims, unless some already stop for it (the node scheduler's rule)."""
        if index in self.in_grace.values() or self.asked == (index, self.releases):
            return
        self.asked = (index, self.releases)  # nothing was freed since: the same search, the same answer
        level = int(job.spec.priority)
        effective_priority(self.queue, self._view(now), job, self.fallbacks)  # checked, as serve does
        req = self.live[index].request
        candidates: dict[int, list[RunningPod]] = {}
        for pod in self._running_pods(req):
            if pod.priority < level and pod.preemptible and int(pod.job_id) not in self.in_grace:
                candidates.setdefault(pod.holding.placement.node, []).append(pod)
        victims = (
            cheapest_victims(self.ledger, req, level, candidates, now, policy=self.queue,
                             view=self._view(now), fallbacks=self.fallbacks)
            if candidates else None
        )  # fmt: skip
        for victim in victims or ():
            v = int(victim.job_id)
            self.in_grace[v] = index
            run = self.running[v]
            run.pod.expected_end = min(run.pod.expected_end, now + self.config.grace_seconds)
            self._push(now + self.config.grace_seconds, v, run.token, stop=True)
            self.preemptions += 1

    def result(self, wall_seconds: float) -> TimedResult:
        frag = np.array(self.fragmentation, dtype=np.float64).reshape(-1, 2)
        return TimedResult(
            trace=self.trace.name,
            placement=self.config.placement,
            queue=self.config.label or self.config.queue,
            load=self.config.load,
            seed=self.config.seed,
            total_gpu_milli=self.ledger.total_gpu_milli - self.aside,
            **self.pods.fields(),
            never_scheduled=self.trace.never_scheduled,
            **self.samples.fields(),
            fragmentation_time=frag[:, 0],
            fragmented_gpu_milli=frag[:, 1],
            wall_seconds=wall_seconds,
            fallbacks={
                **{f"queue.{k}": v for k, v in self.fallbacks.items()},
                **{f"{hook}:{reason}": c for (hook, reason), c in self.placer.fallbacks.items()},
                **guard_faults(self.placer.policy, self.queue),
            },
        )

    def _measure_fragmentation(self, at: float) -> None:
        view = self.ledger.view
        frag = self.measure(view.free_gpu_milli, view.free_cpu_milli, view.node_model)
        self.fragmentation.append((at, float(frag.sum())))


def _wiring(trace: TimedTrace, config: ReplayConfig) -> list[Topology | None] | None:
    """The profile ``config.topology`` on every node with its GPU count; None without one."""
    if config.topology is None:
        return None
    topo = profile(config.topology)
    return [topo if node.gpu_count == topo.n_gpus else None for node in trace.nodes]


def replay_timed(
    trace: TimedTrace,
    config: ReplayConfig,
    estimates: Sequence[float] | None = None,
    progress: Callable[[int, int], None] | None = None,
    guard_config: GuardConfig | None = None,
) -> TimedResult:
    """Replay ``trace`` under ``config``; ``progress(arrived, total)`` is called every 1000 arrivals. A
    policy file (placement or queue) is guarded with ``guard_config`` (default budgets), and the run goes
    whole to a worker process unless it says ``isolate=False`` (``programs/run_isolation.py``)."""
    guard = guard_config or GuardConfig()
    if guard.isolate and (is_policy_path(config.placement) or is_policy_path(config.queue)):
        return isolated_run(
            lambda child, relay: replay_timed(trace, config, estimates, relay if progress else None, child),
            guard,
            progress,
        )
    started = time.perf_counter()
    replay = _Replay(trace, config, estimates, guard)
    replay.run(progress)
    return replay.result(time.perf_counter() - started)
