"""One node's free capacity as a value: what a home's what-ifs (backfill, preemption) change instead of the
ledger.

```text
Ledger.row(node)           -> NodeRow: the node's free CPU, memory, per-GPU compute and memory, and the
                              layouts of its MIG GPUs, copied out of the ledger (later changes of the
                              ledger do not show through)
row.given(placements)      -> the row with those placements' holdings back (victims gone, jobs ended)
row.taken(placements)      -> the row with them held (a job started in the what-if)
row.fit_code(request, ...) -> the one fit rule's answer on the row (``ledger.fit.fit_code``)
```

A placement changes a row exactly as ``Ledger.reserve``/``release`` change the ledger's columns: the
request's CPU and memory on the node, its compute and GPU memory on each of its GPUs, and its MIG instance
in that GPU's layout. Rows are immutable (plain tuples), so what-ifs branch from one row freely.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from gpuslice.hardware.mig import MigLayout
from gpuslice.ledger.fit import fit_code
from gpuslice.ledger.placement import Placement
from gpuslice.workload.request import Request

__all__ = ["NO_MIG", "NodeRow"]

NO_MIG: Mapping[int, MigLayout] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NodeRow:
    """Free capacity of one node: ``gpu_milli`` and ``gpu_memory_bytes`` per GPU slot (the node's GPU
    count, or the ledger's slot width), ``layouts`` GPU -> MigLayout for its MIG GPUs (empty when the
    caller did not ask for them), ``gpu_memory_capacity_bytes`` per GPU for a refusal's amounts."""

    cpu_milli: int
    memory_bytes: int
    gpu_milli: tuple[int, ...]
    gpu_memory_bytes: tuple[int, ...]
    gpu_memory_capacity_bytes: tuple[int, ...] = ()
    layouts: Mapping[int, MigLayout] = field(default_factory=lambda: NO_MIG)

    @classmethod
    def of(
        cls,
        columns: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        node: int,
        gpu_count: int,
        layouts: Mapping[int, MigLayout] = NO_MIG,
    ) -> NodeRow:
        """Row ``node`` of the ledger's columns (free CPU, free memory, free GPU milli, free GPU memory,
        GPU memory capacity: the ledger's own or a snapshot of them), its first ``gpu_count`` GPU slots."""
        cpu, memory, gpu, gpu_memory, capacity = columns
        return cls(
            int(cpu[node]),
            int(memory[node]),
            tuple(gpu[node, :gpu_count].tolist()),
            tuple(gpu_memory[node, :gpu_count].tolist()),
            tuple(capacity[node, :gpu_count].tolist()),
            layouts,
        )

    def given(self, placements: Iterable[Placement]) -> NodeRow:
        """The row with ``placements`` given back (each must be held on this node)."""
        return self._changed(placements, +1)

    def taken(self, placements: Iterable[Placement]) -> NodeRow:
        """The row with ``placements`` held as well."""
        return self._changed(placements, -1)

    def _changed(self, placements: Iterable[Placement], sign: int) -> NodeRow:
        cpu, memory = self.cpu_milli, self.memory_bytes
        gpu, gpu_memory = list(self.gpu_milli), list(self.gpu_memory_bytes)
        layouts: dict[int, MigLayout] | None = None
        for placement in placements:
            req = placement.request
            cpu += sign * req.cpu_milli
            memory += sign * req.memory_bytes
            for g in placement.gpus:
                gpu[g] += sign * req.gpu_milli
                gpu_memory[g] += sign * req.gpu_memory_bytes
            hold = placement.mig
            if hold is not None and hold.gpu in self.layouts:  # layouts are tracked when asked for only
                layouts = dict(self.layouts) if layouts is None else layouts
                layout = layouts[hold.gpu]
                layouts[hold.gpu] = (
                    layout.without(hold.instance) if sign > 0 else layout.with_instance(hold.instance)
                )
        return NodeRow(  # built directly: ``dataclasses.replace`` costs a third of a what-if
            cpu,
            memory,
            tuple(gpu),
            tuple(gpu_memory),
            self.gpu_memory_capacity_bytes,
            self.layouts if layouts is None else MappingProxyType(layouts),
        )

    def mig_slot(self, profile: str) -> bool:
        """Does a MIG GPU of the row have a free start for ``profile``?"""
        return any(layout.has_start(profile) for layout in self.layouts.values())

    def fit_code(self, request: Request, model_ok: bool, usable: Iterable[bool] | None = None) -> int:
        """The one fit rule on this row (``ledger.fit.fit_code``): ``FITS`` or the first check it fails.
        ``model_ok``: whether the node's GPU model is one the request accepts (the ledger's
        ``model_allowed``); ``usable``: the GPUs the home lets it use (None: all)."""
        slot = self.mig_slot(request.mig_profile) if request.mig_profile else None
        return fit_code(
            request,
            model_ok,
            self.gpu_milli,
            self.gpu_memory_bytes,
            self.cpu_milli,
            self.memory_bytes,
            slot,
            None if usable is None else tuple(usable),
        )
