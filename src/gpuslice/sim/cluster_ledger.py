"""The ledger sim places a trace on: the trace's nodes, their MIG-mode GPUs in MIG mode.

A node's first ``mig_gpus`` GPUs (``NodeSpec.mig_gpus``) get their model's MIG table and are set aside
whole in the ledger's columns (``Ledger.hold_whole``), as the Kubernetes extender sets aside its MIG
GPUs: no share or whole-GPU request sees them free, and a MIG request takes no column
(``Request.mig_profile``), only its instance (``Ledger.reserve_mig``). So the GPU figures sim reports
(allocated, unallocated, fragmentation) are those of the GPUs not in MIG mode, and the MIG GPUs' use is
reported apart: the compute slices their instances hold (``mig_slices_held``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuslice.errors import InternalError
from gpuslice.hardware.mig import COMPUTE_SLICES
from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Refusal
from gpuslice.workload.request import MILLI_PER_GPU

__all__ = ["capacity_pct", "cluster_ledger", "mig_slices_held", "set_aside_milli"]


def cluster_ledger(nodes: Sequence[NodeSpec]) -> Ledger:
    """A ledger of ``nodes`` with their MIG-mode GPUs in MIG mode and set aside (module docstring)."""
    geometry = {
        (i, g): table
        for i, node in enumerate(nodes)
        if (table := node.mig_geometry) is not None
        for g in range(node.mig_gpus)
    }
    ledger = Ledger(nodes, mig=geometry)
    for node, gpu in ledger.mig_gpus:
        held = ledger.hold_whole(node, gpu)
        if isinstance(held, Refusal):  # an empty ledger has room for every GPU it holds
            raise InternalError(f"bug: cannot set aside MIG GPU {gpu} of node {node}: {held}")
    return ledger


def set_aside_milli(ledger: Ledger) -> int:
    """The milli-GPU ``cluster_ledger`` set aside: the MIG-mode GPUs, whole."""
    return len(ledger.mig_gpus) * MILLI_PER_GPU


def mig_slices_held(ledger: Ledger) -> tuple[int, int]:
    """(compute slices the live MIG instances hold, compute slices of every MIG-mode GPU)."""
    held = 0
    for node, gpu in ledger.mig_gpus:
        layout = ledger.mig_layout(node, gpu)
        if layout is not None:
            held += sum(i.profile.compute_slices for i in layout.instances)
    return held, COMPUTE_SLICES * len(ledger.mig_gpus)


def capacity_pct(milli: np.ndarray | float, total_milli: int) -> np.ndarray:
    """``milli`` as % of the GPU capacity outside MIG mode (``total_milli``); NaN, and no division
    warning, on a cluster whose every GPU is in MIG mode: it has no such figures."""
    if not total_milli:
        return np.full(np.shape(milli), np.nan)
    return 100.0 * np.asarray(milli) / total_milli
