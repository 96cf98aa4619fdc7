"""The replay's one adapter to serve's queue family: job specs, the EASY reservation and preemption victims
over a cluster, through the functions the node scheduler uses (``order_pending``, ``effective_priority``,
``backfill.shadow`` / ``backfill.allows``, ``preemption.find_preemption``).

Those functions work on a capacity (``copy`` / ``give`` / ``take`` of placements, ``backfill.WhatIf``)
and a "does the blocked job fit" predicate; the node scheduler's capacity is one machine's GPUs. Here a
pod of the trace lands on one node of many, so:

- ``ClusterCapacity`` is the cluster's free capacity as the ledger has it, with the nodes a what-if
  changed kept aside (copy-on-write, so a copy costs only the nodes touched), bound to the blocked job's
  request: it keeps the set of nodes where that job would fit, and "the head fits" is "that set is not
  empty". EASY backfill then means what it means on one machine: a later job may start now if it ends
  before the head's reservation, or if the head still fits somewhere with it running.
- preemption is the one search every home uses (``find_preemption``): victims node by node (a pod
  needs its room on one node), the node whose victim set costs least (GPUs freed, priorities, work
  lost, names).

A trace pod becomes a ``JobSpec`` whose priority comes from its QoS class (``QOS_PRIORITY``), whose
tenant is the QoS class (fair share between classes: the trace names no users), and whose
``max_runtime_seconds`` is the run-time estimate the setup gives (the recorded duration, a prediction,
or none): what SJF orders by and what the EASY reservation is computed from.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpuslice.hardware.mig import MigInstance, MigLayout
from gpuslice.ledger.fit import FITS
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement
from gpuslice.ledger.whatif import NO_MIG, NodeRow
from gpuslice.policies.queue.base import JobRef, QueueOps, QueueView
from gpuslice.scheduler import backfill
from gpuslice.scheduler.node_fit import gpus_equivalent
from gpuslice.scheduler.preemption import Victim, find_preemption
from gpuslice.workload.job import JobSpec, Priority
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = [
    "QOS_PRIORITY",
    "ClusterCapacity",
    "ClusterHolding",
    "RunningPod",
    "cheapest_victims",
    "job_spec",
    "may_backfill",
    "reservation",
]

# Kubernetes' and Alibaba's QoS classes as queue priorities: latency-sensitive and guaranteed pods above
# burstable ones, best-effort pods lowest (so they are the ones preempted).
QOS_PRIORITY: Mapping[str, Priority] = {
    "LS": Priority.HIGH,
    "Guaranteed": Priority.HIGH,
    "Burstable": Priority.NORMAL,
    "BE": Priority.LOW,
}


def job_spec(name: str, request: Request, qos: str, estimate: float | None) -> JobSpec:
    """What serve's queue policies read of a trace pod (its GPUs, priority, tenant, declared run time;
    a MIG pod is one GPU's instance of its profile, as serve's MIG jobs)."""
    share = request.num_gpu == 1 and request.gpu_milli < MILLI_PER_GPU
    return JobSpec(
        command=(name,),
        gpus=1 if request.mig_profile else request.num_gpu,
        mig_profile=request.mig_profile,
        compute_percent=max(1, request.gpu_milli * 100 // MILLI_PER_GPU) if share else 0,
        priority=QOS_PRIORITY.get(qos, Priority.NORMAL),
        tenant=qos or "unknown",
        max_runtime_seconds=None if estimate is None else max(estimate, 1e-3),
    )


@dataclass(frozen=True, slots=True)
class ClusterHolding:
    """A running pod's placement in the shape the queue mechanism reads (``gpus``, ``milli``, ``mig``)."""

    placement: Placement

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.placement.gpus

    @property
    def milli(self) -> int:
        return self.placement.request.gpu_milli

    @property
    def mig(self) -> MigInstance | None:
        """The MIG instance a MIG pod holds (its GPU share for fair share: compute slices / 7)."""
        return None if self.placement.mig is None else self.placement.mig.instance

    # sim's pods hold milli-GPU only (openb has no GPU memory column), so their GPU-equivalent is their
    # compute fraction and callers pass 0 as the GPU's memory size
    memory_bytes = 0


@dataclass(slots=True)
class RunningPod:
    """A running pod as the adapter sees it: when it is expected to end, and whether it may be preempted."""

    job_id: str
    holding: ClusterHolding
    priority: int
    started_at: float
    expected_end: float
    preemptible: bool = True


class ClusterCapacity:
    """The ledger's free capacity when this was made, with what-if changes, bound to one request (module
    docstring). Later changes of the ledger do not show through: it is a snapshot. A node's row is the
    ledger's ``NodeRow`` and changes by its arithmetic (``given`` / ``taken``); for a MIG request the rows
    carry the MIG GPUs' layouts too."""

    __slots__ = ("_allowed", "_base", "_changed", "_gpu_count", "_mig", "fit_nodes", "request")

    def __init__(self, ledger: Ledger, request: Request, fit_nodes: set[int] | None = None) -> None:
        cpu, memory, gpu, gpu_memory, capacity = ledger.row_columns()
        # a snapshot of what changes; the GPU memory capacity never does
        self._base = (cpu.copy(), memory.copy(), gpu.copy(), gpu_memory.copy(), capacity)
        self._gpu_count = ledger.view.gpu_count
        self.request = request
        # the models the fit rule checks: a GPU request's, a MIG request's when it names any
        pinned = request.mig_profile and (request.gpu_models or request.excluded_gpu_models)
        self._allowed = ledger.model_allowed(request) if request.num_gpu or pinned else None
        self._mig: dict[int, Mapping[int, MigLayout]] = {}  # node -> its MIG GPUs' layouts (immutable)
        if request.mig_profile:
            for node in {node for node, _ in ledger.mig_gpus}:
                self._mig[node] = ledger.row(node).layouts
        self._changed: dict[int, NodeRow] = {}
        self.fit_nodes = (
            set(np.flatnonzero(ledger.fits(request)).tolist()) if fit_nodes is None else fit_nodes
        )

    def copy(self) -> ClusterCapacity:
        twin = ClusterCapacity.__new__(ClusterCapacity)
        twin._base, twin._gpu_count, twin.request, twin._allowed = (
            self._base,
            self._gpu_count,
            self.request,
            self._allowed,
        )
        twin._mig = self._mig  # never changed: a what-if's layouts live in its rows
        twin._changed = dict(self._changed)  # rows are values: replaced, never changed in place
        twin.fit_nodes = set(self.fit_nodes)
        return twin

    def give(self, placement: Placement) -> None:
        self._set(placement.node, self.row(placement.node).given((placement,)))

    def take(self, placement: Placement) -> None:
        self._set(placement.node, self.row(placement.node).taken((placement,)))

    def fits_now(self) -> bool:
        return bool(self.fit_nodes)

    def row(self, node: int) -> NodeRow:
        """The node's row in this what-if."""
        row = self._changed.get(node)
        if row is None:
            row = NodeRow.of(self._base, node, int(self._gpu_count[node]), self._mig.get(node, NO_MIG))
        return row

    def fits(self, node: int, row: NodeRow) -> bool:
        """The ledger's fit rule for the request on ``row`` of ``node`` (its one-node form)."""
        allowed = self._allowed is None or bool(self._allowed[node])
        return row.fit_code(self.request, allowed) == FITS

    def _set(self, node: int, row: NodeRow) -> None:
        self._changed[node] = row
        if self.fits(node, row):
            self.fit_nodes.add(node)
        else:
            self.fit_nodes.discard(node)


def _fits_without(capacity: ClusterCapacity, node: int, gone: Sequence[Victim]) -> bool:
    """Would the capacity's request fit on ``node`` with the ``gone`` pods' placements given back? Asked
    for many subsets by the preemption search, on the node's row without a what-if copy."""
    return capacity.fits(node, capacity.row(node).given(v.holding.placement for v in gone))


def _head_fits(capacity: ClusterCapacity) -> bool:
    return capacity.fits_now()


def reservation(
    ledger: Ledger, head: Request, running: Iterable[RunningPod]
) -> backfill.Shadow[ClusterCapacity] | None:
    """The blocked head's EASY reservation: ``backfill.shadow`` over the running pods' expected ends."""
    pods = [(r.expected_end, r.holding.placement) for r in running if math.isfinite(r.expected_end)]
    return backfill.shadow(ClusterCapacity(ledger, head), pods, _head_fits)


def may_backfill(shadow: backfill.Shadow[ClusterCapacity] | None, placement: Placement, end: float) -> bool:
    """``backfill.allows`` for a pod placed (not yet started) at ``placement``, running until ``end``."""
    return backfill.allows(shadow, placement, end, _head_fits)


def cheapest_victims(
    ledger: Ledger,
    head: Request,
    head_priority: int,
    by_node: Mapping[int, Sequence[RunningPod]],
    now: float,
    *,
    policy: QueueOps | None = None,
    view: QueueView | None = None,
    fallbacks: Counter[str] | None = None,
) -> tuple[RunningPod, ...] | None:
    """The cheapest set of pods on one node whose release lets ``head`` start there, or None.

    Victims follow the node scheduler's rule: preemptible, own priority strictly below the head's, not
    already being preempted (the caller leaves those out of ``by_node``)."""
    empty = ClusterCapacity(ledger, head, fit_nodes=set())  # the head fits on no node now
    pods = {r.job_id: r for running in by_node.values() for r in running}
    victims = [
        Victim(r.job_id, r.priority, r.started_at, gpus_equivalent(r.holding, 0),  # type: ignore[arg-type]
               node=node, preemptible=r.preemptible, holding=r.holding)
        for node, running in by_node.items()
        for r in running
    ]  # fmt: skip

    def fits_without(node: object, gone: tuple[Victim, ...]) -> bool:
        return _fits_without(empty, node, gone)  # type: ignore[arg-type]

    plan = find_preemption(
        JobRef("", head_priority), victims, fits_without, now, policy=policy, view=view, fallbacks=fallbacks
    )
    return None if plan is None else tuple(pods[v.job_id] for v in plan.victims)
