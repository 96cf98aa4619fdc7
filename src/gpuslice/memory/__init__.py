"""GPU memory oversubscription engine: gpu_ext's eviction and prefetch hooks in user space, judged
against Belady (gpu_ext, Zheng et al., arXiv 2512.12615; docs/references.md). Sits beside the scheduler;
imports only units and errors.

``uvm`` the UVM model · ``hooks`` the ops table and decision context · ``policies`` one policy per file ·
``workloads`` trace generators and CSV · ``cost`` estimated time · ``simulator`` the replay ·
``compiled`` the driver default's replay in numba (loaded only when used).
"""

from __future__ import annotations

from gpuslice.memory.cost import LINKS, CostModel
from gpuslice.memory.hooks import MemoryOps, MemoryView
from gpuslice.memory.policies import EVICTION, PREFETCH, UnknownMemoryPolicy, make_ops
from gpuslice.memory.simulator import SimConfig, SimResult, simulate
from gpuslice.memory.workloads import WORKLOADS, Trace, UnknownWorkload, make_workload

__all__ = [
    "EVICTION",
    "LINKS",
    "PREFETCH",
    "WORKLOADS",
    "CostModel",
    "MemoryOps",
    "MemoryView",
    "SimConfig",
    "SimResult",
    "Trace",
    "UnknownMemoryPolicy",
    "UnknownWorkload",
    "make_ops",
    "make_workload",
    "simulate",
]
