"""Least loaded: spread requests over the nodes with the most free GPU and CPU left after placing.

Optimises: free GPU (milli) + cpu_weight · free CPU (milli) after the request, higher is better; the
opposite of best fit. The weight is an operator knob kept in a Map, like gpu_ext's config ARRAY maps;
unset, it is 0. Whatever holds the policy in a ``PolicySlot`` sets it by name, the way ``bpftool map
update`` does: ``slot.map_update("config", "cpu_weight", "0.25")``.
Where it works well: few large jobs that each want a node to themselves for as long as possible.
Weakness: spreading leaves every node partly used, so an 8-GPU job may find no empty node.
"""

from __future__ import annotations

import numpy as np

from gpuslice.programs.api import LedgerView, Map, PlacementOps, Request

DEFAULT_CPU_WEIGHT = 0.0  # GPUs only unless an operator says otherwise


class LeastLoaded(PlacementOps):
    name = "least-loaded"
    summary = "most free GPU (and optionally CPU) left after placing"
    memory_in_score = False

    config = Map(key=str, value=float, max_entries=8)  # "cpu_weight" -> weight of free CPU milli

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        gpu_left = view.free_gpu_milli[nodes].sum(axis=1) - req.total_gpu_milli
        cpu_left = view.free_cpu_milli[nodes] - req.cpu_milli
        weight = self.config.get("cpu_weight", DEFAULT_CPU_WEIGHT)
        return gpu_left + weight * cpu_left
