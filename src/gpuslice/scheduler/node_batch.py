"""Serve's batch of multi-GPU jobs: the set the joint assignment gives the job being started now.

When the node scheduler's pass reaches a job asking for several whole GPUs and other such jobs wait after
it in the queue order, their GPU sets are chosen together (``policies/gpuset/batch.py``) instead of one
at a time, and the set the joint optimum gives this job is passed to the placer as ``batch``: the
placement policy's own advice still comes first, and the set goes through the same ledger, usable-GPU
and topology-need checks (``Placer.pick_gpus``). The later jobs get nothing reserved here: when the pass
reaches each of them the batch is solved again over what is then free, so a job that waits for its
quota or behind a blocked head costs the others only the hint.

Which jobs join: this one, then the later whole-GPU jobs of 2 or more GPUs in queue order while their
GPU counts together still fit the free whole GPUs this job may use (``first_of_batch``, at most
``MAX_BATCH`` jobs); a machine whose wiring is unknown has no batch (every set is equal there).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gpuslice.hardware.topology import Topology
from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.gpuset.batch import BatchJob, first_of_batch
from gpuslice.scheduler.node_fit import Demand, DemandKind
from gpuslice.workload.request import MILLI_PER_GPU

__all__ = ["batch_set", "multi_gpu"]


def multi_gpu(demand: Demand) -> bool:
    """A demand for two or more whole GPUs: the only kind a GPU-set choice exists for."""
    return demand.kind is DemandKind.WHOLE and demand.count >= 2


def batch_set(
    view: LedgerView, topology: Topology | None, demand: Demand, later: Iterable[Demand]
) -> tuple[int, ...] | None:
    """The set the joint assignment gives ``demand``, the first of the batch; None when there is no
    batch (no wiring, not multi-GPU, no other multi-GPU job fits beside it) or it gets no set."""
    if topology is None or not multi_gpu(demand):
        return None
    whole = view.free_gpu_milli[0, : topology.n_gpus] >= MILLI_PER_GPU
    free = [int(g) for g in np.flatnonzero(whole)]
    others = [_job(d) for d in later if multi_gpu(d)]
    return first_of_batch(topology, free, _job(demand), others)


def _job(demand: Demand) -> BatchJob:
    return BatchJob("", demand.count, demand.need, tuple(demand.eligible))
