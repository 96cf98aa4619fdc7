"""The ledger's MIG part: which GPUs are in MIG mode (their geometry) and the instances held on each.

A GPU in MIG mode is given to the ledger with its MIG table (``hardware.mig.mig_gpu``); every MIG
instance a workload holds there is a placement with a ``MigHold`` (GPU, instance), taken by
``Ledger.reserve_mig`` and given back by ``Ledger.release`` like any other. The check, in order:

```text
NO_MIG_SLOT   the GPU is not in MIG mode, the profile is not one of its table, the start is not one
              the placement table allows, its memory slices overlap a held instance, or the profile's
              per-GPU cap is reached (``MigLayout.can_place``)
```

then the placement's columns are checked as any request's. Which columns a MIG instance takes is the
home's choice, given as the request: serve takes the instance's share of the GPU (``mig_request``:
compute slices as milli, memory slices as bytes); the extender and sim set the whole MIG GPU aside
(``Ledger.hold_whole``) when they build the ledger, so shares never land there, and their MIG requests
take no GPU column (the extender's ``Request(cpu_milli=0)``; sim's ``Request(cpu, memory,
mig_profile=...)``, which the fit rule judges on model, a free start — ``MigInstances.slots`` — CPU
and memory). The held instances of one GPU are read as a ``MigLayout``, what the one MIG choice's
candidates are built from (``scheduler.mig_choice.mig_candidate``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from gpuslice.hardware.mig import COMPUTE_SLICES, MEMORY_SLICES, MigGpu, MigInstance, MigLayout, MigProfile
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = ["MigHold", "MigInstances", "mig_request"]


@dataclass(frozen=True, slots=True)
class MigHold:
    """One MIG instance held on GPU ``gpu`` of the placement's node."""

    gpu: int
    instance: MigInstance


def mig_request(profile: MigProfile, gpu_memory_bytes: int) -> Request:
    """The columns a MIG instance takes where a home counts instances in them (serve): its compute
    slices as milli (floor of slices × 1000 / 7, so non-overlapping instances never sum past 1000) and
    its memory slices' share of the GPU's memory."""
    return Request(
        cpu_milli=0,
        num_gpu=1,
        gpu_milli=max(1, profile.compute_slices * MILLI_PER_GPU // COMPUTE_SLICES),
        gpu_memory_bytes=gpu_memory_bytes * profile.memory_slices // MEMORY_SLICES,
    )


class MigInstances:
    """Per (node, GPU) in MIG mode: its geometry and the layout of the instances held there."""

    def __init__(self, geometries: Mapping[tuple[int, int], MigGpu], node_count: int) -> None:
        self.geometries: dict[tuple[int, int], MigGpu] = dict(geometries)
        self._layouts = {key: MigLayout(geometry) for key, geometry in self.geometries.items()}
        self._node_count = node_count
        gpus: dict[int, list[int]] = {}
        for node, gpu in sorted(self.geometries):
            gpus.setdefault(node, []).append(gpu)
        self._gpus = {node: tuple(g) for node, g in gpus.items()}  # node -> its MIG GPUs
        # profile name -> bool per node (a free start there), for the profiles asked so far; a take or a
        # give refreshes its node only, so the fit rule reads a MIG request's nodes without a GPU loop
        self._slots: dict[str, np.ndarray] = {}

    def layout(self, node: int, gpu: int) -> MigLayout | None:
        """The instances held on that GPU (an immutable value); None if it is not in MIG mode."""
        return self._layouts.get((node, gpu))

    def gpus_on(self, node: int) -> tuple[int, ...]:
        """The node's GPUs in MIG mode, lowest first."""
        return self._gpus.get(node, ())

    def layouts_on(self, node: int) -> dict[int, MigLayout]:
        """The node's MIG GPUs and their layouts now, GPU -> layout, lowest first."""
        return {gpu: self._layouts[node, gpu] for gpu in self.gpus_on(node)}

    def slots(self, profile: str) -> np.ndarray:
        """Bool per node (read-only): a MIG GPU of the node whose table has ``profile`` has a free start
        for it now."""
        cached = self._slots.get(profile)
        if cached is None:
            cached = np.zeros(self._node_count, dtype=bool)
            for node in self._gpus:
                cached[node] = self._node_has_start(node, profile)
            cached.flags.writeable = False
            self._slots[profile] = cached
        return cached

    def _node_has_start(self, node: int, profile: str) -> bool:
        return any(self._layouts[node, gpu].has_start(profile) for gpu in self.gpus_on(node))

    def _refresh(self, node: int) -> None:
        for profile, cached in self._slots.items():
            cached.flags.writeable = True
            cached[node] = self._node_has_start(node, profile)
            cached.flags.writeable = False

    def check(self, node: int, hold: MigHold) -> Refusal | None:
        layout = self._layouts.get((node, hold.gpu))
        instance = hold.instance
        if (
            layout is None
            or instance.profile not in layout.gpu.profiles
            or not layout.can_place(instance.profile, instance.start)
        ):
            return Refusal(RefusalCode.NO_MIG_SLOT, node, gpu=hold.gpu)
        return None

    def take(self, node: int, hold: MigHold) -> None:
        key = (node, hold.gpu)
        self._layouts[key] = self._layouts[key].with_instance(hold.instance)
        self._refresh(node)

    def give(self, node: int, hold: MigHold) -> None:
        key = (node, hold.gpu)
        self._layouts[key] = self._layouts[key].without(hold.instance)
        self._refresh(node)

    def agrees_with(self, live: Iterable[Placement]) -> bool:
        """Each GPU's layout holds exactly the live placements' instances there, all on MIG GPUs."""
        expected: dict[tuple[int, int], list[MigInstance]] = {k: [] for k in self._layouts}
        for p in live:
            if p.mig is not None:
                held = expected.get((p.node, p.mig.gpu))
                if held is None:
                    return False
                held.append(p.mig.instance)
        held = all(
            sorted(map(str, expected[k])) == sorted(map(str, layout.instances))
            for k, layout in self._layouts.items()
        )
        fresh = all(  # every cached slot answer is what the layouts say now
            cached[node] == self._node_has_start(node, profile)
            for profile, cached in self._slots.items()
            for node in range(self._node_count)
        )
        return held and fresh
