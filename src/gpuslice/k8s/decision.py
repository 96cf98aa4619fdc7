"""Where the extender put a pod, down to the GPU: the decision it writes at bind as pod annotations
(``annotations.DECISION_ANNOTATIONS``), which the device plugin reads at Allocate and the extender reads
back after a restart.

A pod where one container asks has one slice: the keys ``gpuslice.io/gpu-indices``, ``/gpu-uuids``,
``/gpumem-mib``, ``/gpucores`` and ``/mig-instance`` describe it. A pod where several do (each app
container its own slice; init containers inside the first one's, see ``annotations``) has them all in
``gpuslice.io/container-slices``, in the kubelet's allocation order, and the keys describe the first app
container's; ``gpuslice.io/allocated-containers`` counts the containers Allocate has answered, so the
device plugin knows whose turn it is (``Decision.current``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuslice.errors import InvalidRequest
from gpuslice.k8s.annotations import (
    ANNOTATION_ALLOCATED_CONTAINERS,
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_CONTAINER,
    ANNOTATION_CONTAINER_SLICES,
    ANNOTATION_GPU_INDICES,
    ANNOTATION_GPU_UUIDS,
    ANNOTATION_GPUCORES,
    ANNOTATION_GPUMEM_MIB,
    ANNOTATION_MIG_INSTANCE,
    ANNOTATION_NODE,
    BIND_PHASE_ALLOCATING,
)

__all__ = ["ContainerDecision", "Decision", "MigChoice"]


@dataclass(frozen=True, slots=True)
class MigChoice:
    """One MIG instance chosen for a pod: on GPU ``gpu_index``, profile at ``start``, with its UUID."""

    gpu_index: int
    profile: str
    start: int
    uuid: str = ""

    def __str__(self) -> str:
        return f"{self.gpu_index}:{self.profile}@{self.start}" + (f":{self.uuid}" if self.uuid else "")

    @classmethod
    def parse(cls, text: str) -> MigChoice:
        gpu, _, rest = text.partition(":")
        where, _, uuid = rest.partition(":")
        profile, _, start = where.partition("@")
        if not (gpu.isdigit() and profile and start.isdigit()):
            raise InvalidRequest(f"{ANNOTATION_MIG_INSTANCE}={text!r}: expected GPU:PROFILE@START[:UUID]")
        return cls(int(gpu), profile, int(start), uuid)


@dataclass(frozen=True, slots=True)
class ContainerDecision:
    """One asking container's slice in a pod where several ask. ``inside``: an init container that runs
    inside the pod's first slice (its GPUs are among that slice's, its limits its own)."""

    container: str
    gpu_indices: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    memory_mib: int = 0
    cores_percent: int = 100
    mig: MigChoice | None = None
    inside: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "container": self.container, "gpuIndices": list(self.gpu_indices),
            "gpuUuids": list(self.gpu_uuids), "gpumemMiB": self.memory_mib, "gpucores": self.cores_percent,
            "inside": self.inside,
        }  # fmt: skip
        if self.mig is not None:
            out["mig"] = str(self.mig)
        return out

    @classmethod
    def from_json(cls, data: Any) -> ContainerDecision:
        if not isinstance(data, Mapping):
            raise InvalidRequest(f"{ANNOTATION_CONTAINER_SLICES}: each entry must be an object")
        try:
            indices = tuple(int(i) for i in data.get("gpuIndices", ()))
            uuids = tuple(str(u) for u in data.get("gpuUuids", ()))
            mig = data.get("mig")
            return cls(
                str(data["container"]), indices, uuids, int(data.get("gpumemMiB", 0)),
                int(data.get("gpucores", 100)), MigChoice.parse(str(mig)) if mig else None,
                bool(data.get("inside", False)),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as err:
            raise InvalidRequest(f"malformed {ANNOTATION_CONTAINER_SLICES} entry: {err}") from None


@dataclass(frozen=True, slots=True)
class Decision:
    """Where the extender put a pod, down to the GPU: written at bind, read by the device plugin.

    ``memory_mib`` 0 means the whole memory of each GPU; ``cores_percent`` is per GPU (100 = whole).
    ``containers``: every asking container's slice when more than one asks (else empty), in the
    kubelet's allocation order; ``allocated``: how many of them Allocate has answered.
    """

    node: str
    container: str
    gpu_indices: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    memory_mib: int = 0
    cores_percent: int = 100
    mig: MigChoice | None = None
    phase: str = BIND_PHASE_ALLOCATING
    bind_time: int = 0
    containers: tuple[ContainerDecision, ...] = ()
    allocated: int = 0

    @property
    def slice_count(self) -> int:
        """How many Allocate calls the pod's decision answers (one per asking container)."""
        return max(1, len(self.containers))

    def current(self) -> Decision:
        """The decision of the container whose Allocate comes next: the pod's own for one container,
        else its slice at ``allocated`` (the last one once all are answered) in the pod's terms."""
        c = self._next_slice()
        if c is None:
            return self
        return replace(
            self, container=c.container, gpu_indices=c.gpu_indices, gpu_uuids=c.gpu_uuids,
            memory_mib=c.memory_mib, cores_percent=c.cores_percent, mig=c.mig,
        )  # fmt: skip

    @property
    def current_is_inside(self) -> bool:
        """Does the container whose Allocate comes next run inside the pod's first slice?"""
        c = self._next_slice()
        return c is not None and c.inside

    def _next_slice(self) -> ContainerDecision | None:
        """The slice at ``allocated`` (the last one once all are answered); None for one container."""
        return self.containers[min(self.allocated, len(self.containers) - 1)] if self.containers else None

    def to_annotations(self) -> dict[str, str]:
        out = {
            ANNOTATION_NODE: self.node,
            ANNOTATION_CONTAINER: self.container,
            ANNOTATION_GPU_INDICES: ",".join(str(i) for i in self.gpu_indices),
            ANNOTATION_GPU_UUIDS: ",".join(self.gpu_uuids),
            ANNOTATION_GPUMEM_MIB: str(self.memory_mib),
            ANNOTATION_GPUCORES: str(self.cores_percent),
            ANNOTATION_BIND_PHASE: self.phase,
            ANNOTATION_BIND_TIME: str(self.bind_time),
        }
        if self.mig is not None:
            out[ANNOTATION_MIG_INSTANCE] = str(self.mig)
        if self.containers:
            slices = [c.to_json() for c in self.containers]
            out[ANNOTATION_CONTAINER_SLICES] = json.dumps(slices, separators=(",", ":"))
        return out

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> Decision | None:
        """The decision in a pod's annotations; None if it has none; InvalidRequest if it is malformed."""
        node = annotations.get(ANNOTATION_NODE)
        if not node:
            return None
        try:
            indices = tuple(int(i) for i in annotations.get(ANNOTATION_GPU_INDICES, "").split(",") if i)
            uuids = tuple(u for u in annotations.get(ANNOTATION_GPU_UUIDS, "").split(",") if u)
            memory = int(annotations.get(ANNOTATION_GPUMEM_MIB, "0") or 0)
            cores = int(annotations.get(ANNOTATION_GPUCORES, "100") or 100)
            bind_time = int(annotations.get(ANNOTATION_BIND_TIME, "0") or 0)
            allocated = int(annotations.get(ANNOTATION_ALLOCATED_CONTAINERS, "0") or 0)
            slices = json.loads(annotations.get(ANNOTATION_CONTAINER_SLICES) or "[]")
        except ValueError as err:
            raise InvalidRequest(f"malformed gpuslice decision annotations on a pod: {err}") from None
        if not isinstance(slices, list):
            raise InvalidRequest(f"{ANNOTATION_CONTAINER_SLICES} must be a JSON list")
        if allocated < 0:
            raise InvalidRequest(f"{ANNOTATION_ALLOCATED_CONTAINERS} must not be negative: {allocated}")
        mig_text = annotations.get(ANNOTATION_MIG_INSTANCE)
        return cls(
            node=node,
            container=annotations.get(ANNOTATION_CONTAINER, ""),
            gpu_indices=indices,
            gpu_uuids=uuids,
            memory_mib=memory,
            cores_percent=cores,
            mig=MigChoice.parse(mig_text) if mig_text else None,
            phase=annotations.get(ANNOTATION_BIND_PHASE, BIND_PHASE_ALLOCATING),
            bind_time=bind_time,
            containers=tuple(ContainerDecision.from_json(c) for c in slices),
            allocated=allocated,
        )
