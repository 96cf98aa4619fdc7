"""How serve's node scheduler asks the shared placer for a job's GPUs, as sim and the extender do.

The machine is a one-node ledger; the placement policy (a registered class or a policy file's guarded
factory) advises through ``Placer.pick_gpus``, with the GPUs the job may not use masked out (other
models, MIG mode, unhealthy) and the machine's wiring for multi-GPU sets and topology needs.

FGD-style policies measure fragmentation against a target workload: the one given (``--target-workload``),
else the distinct shapes of the jobs the scheduler knows, so the policy is rebuilt only when that set of
shapes changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from gpuslice.hardware.topology import Topology
from gpuslice.ledger.ledger import Ledger, LedgerView
from gpuslice.policies.base import PlacementOps, PolicyContext
from gpuslice.scheduler.node_batch import batch_set
from gpuslice.scheduler.node_fit import Choice, Demand, DemandKind, Holding
from gpuslice.scheduler.placer import Placer
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

__all__ = ["NodeGpuChoice"]


class NodeGpuChoice:
    def __init__(
        self,
        ledger: Ledger,
        topology: Topology | None,
        placement: Callable[[LedgerView, PolicyContext], PlacementOps],
        target: TargetWorkload | None,
    ) -> None:
        self.ledger = ledger
        self.topology = topology
        self.placement = placement
        self.target = target
        self._placer: Placer | None = None
        self._shapes: frozenset[Request] = frozenset()

    def choose(
        self, demand: Demand, known: frozenset[Request], later: Iterable[Demand] = ()
    ) -> Choice | None:
        """The GPUs for a demand the ledger has room for (NONE, SHARE or WHOLE); None only if no usable
        set exists. ``known``: the requests of the jobs the scheduler knows, for the default target;
        ``later``: the demands queued after this one, for the joint choice of multi-GPU sets
        (node_batch.py; read only for a multi-GPU demand)."""
        req = demand.request  # built once, at submit: what the fit rule judged and the start reserves
        if demand.kind is DemandKind.NONE:
            return Choice((), Holding((), request=req))
        usable = np.zeros(self.ledger.view.free_gpu_milli.shape[1], dtype=bool)
        usable[list(demand.eligible)] = True
        batch = batch_set(self.ledger.view, self.topology, demand, later)
        gpus = self.placer(known).pick_gpus(req, 0, usable, self.topology, demand.need, batch)
        if gpus is None:
            return None
        return Choice(gpus, Holding(gpus, req.gpu_milli, req.gpu_memory_bytes, request=req))

    def placer(self, known: frozenset[Request] = frozenset()) -> Placer:
        """The placer with the policy built for the current target workload."""
        shapes = frozenset() if self.target is not None else known
        # the same set object again (one scheduling pass) needs no element-by-element comparison
        if self._placer is None or (shapes is not self._shapes and shapes != self._shapes):
            target = self.target
            if target is None and shapes:
                target = TargetWorkload.from_requests(sorted(shapes, key=str))
            context = PolicyContext(rng=np.random.default_rng(0), target=target)
            policy = self.placement(self.ledger.view, context)
            self._placer = Placer(self.ledger, policy, topologies=[self.topology])
            self._shapes = shapes
        return self._placer
