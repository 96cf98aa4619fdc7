"""GetPreferredAllocation and Allocate: which devices a pod gets, read from its scheduling decision."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from gpuslice.errors import UserError
from gpuslice.hardware.machine import Machine
from gpuslice.k8s.annotations import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_ALLOCATED_CONTAINERS,
    ANNOTATION_BIND_PHASE,
    BIND_PHASE_ALLOCATED,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_FAILED,
    MigSlot,
)
from gpuslice.k8s.container_slice import container_slice, slice_holder
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.device_plugin.devices import (
    CDI_KIND,
    PluginDevice,
    Resource,
    stand_in_device_node,
)
from gpuslice.k8s.device_plugin.kube import PendingPod, PodSource
from gpuslice.k8s.device_plugin.record import AllocationRecord
from gpuslice.k8s.node_lock import allocate_key, decision_key
from gpuslice.k8s.proto import deviceplugin_pb2 as pb
from gpuslice.k8s.shim_mounts import slice_folder
from gpuslice.node.enforcement import SharingMode
from gpuslice.policies.gpuset import GpuSetOps
from gpuslice.policies.gpuset.pick import pick_gpu_set
from gpuslice.scheduler.node_decisions import MigAssignment
from gpuslice.units import MiB

__all__ = [
    "Allocation",
    "AllocationRefused",
]

log = logging.getLogger(__name__)


class AllocationRefused(UserError):
    """Allocate cannot be answered from a scheduling decision; the pod fails with this message."""


class Allocation:
    """The plugin's GetPreferredAllocation and Allocate answers (a part of ``DevicePlugin``, which sets
    the attributes below in its constructor)."""

    machine: Machine
    node_name: str
    pods: PodSource
    policy: GpuSetOps
    sharing: SharingMode
    state_dir: Path
    record: AllocationRecord  # the slices given, for the node's metrics
    _mig: dict[int, tuple[MigSlot, ...]]
    _by_id: dict[str, PluginDevice]
    _health: dict[str, bool]
    _gpu_healthy: dict[int, bool]
    _allocate_lock: threading.Lock
    _minors: tuple[int, ...]
    _simulated: bool  # no NVIDIA driver: device nodes are stand-ins (``stand_in_device_node``)

    def _only_waiting(self, fits: Callable[[Decision], bool]) -> Decision | None:
        """The decision of the one pod waiting on this node that ``fits`` this call (pods waiting for
        another kind of Allocate call do not count); None if none or several wait (Allocate refuses
        then, and the preference does not matter)."""
        try:
            pods = self.pods.allocating_pods(self.node_name)
        except Exception as err:
            log.error("could not list pods bound to %s: %s", self.node_name, err)
            return None
        candidates = [p for p in pods if not _placed(p) or fits(p.decision.current())]
        decision = candidates[0].decision if len(candidates) == 1 else None
        if decision is None or not _placed(candidates[0]):
            return None
        return decision.current()

    def _preferred(
        self, resource: Resource, request: pb.PreferredAllocationRequest
    ) -> pb.PreferredAllocationResponse:
        answers = []
        for req in request.container_requests:
            available = [d for d in resource.devices if d.id in set(req.available_deviceIDs)]
            must = [self._by_id[i] for i in req.must_include_deviceIDs if i in self._by_id]
            size = int(req.allocation_size)
            if resource.mig_profile:
                chosen = self._prefer_mig(resource, available, must, size)
            else:
                chosen = self._prefer_shares(available, must, size)
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=[d.id for d in chosen]))
        return pb.PreferredAllocationResponse(container_responses=answers)

    def _prefer_shares(
        self, available: list[PluginDevice], must: list[PluginDevice], size: int
    ) -> list[PluginDevice]:
        """One share per GPU: the GPUs a waiting pod's decision names, else ``pick_gpu_set``'s choice."""
        per_gpu: dict[int, list[PluginDevice]] = {}
        for d in available:
            per_gpu.setdefault(d.gpu, []).append(d)
        must_gpus = {d.gpu for d in must}
        decision = self._only_waiting(lambda dec: dec.mig is None and len(dec.gpu_indices) == size)
        gpus: tuple[int, ...] | None = None
        if decision is not None:
            decided = self._decision_gpus(decision)
            if decided and set(decided) >= must_gpus and all(g in per_gpu for g in decided):
                gpus = decided
        if gpus is None and 0 < size <= len(per_gpu) and len(must_gpus) <= size:
            # the GPU-set choice every home makes (the placer, topo pick): the GPU-set policy's advice,
            # or with must-include GPUs the exact ranking over the sets that hold them
            gpus = pick_gpu_set(
                self.machine.topology, sorted(per_gpu), size, must=must_gpus, policy=self.policy
            )
        chosen = list(must)
        if gpus is not None:
            for g in gpus:
                if g not in {d.gpu for d in chosen}:
                    chosen.append(per_gpu[g][0])
        # More shares than distinct GPUs (or must-includes that rule out a topology choice): fill up,
        # spreading round-robin over the GPUs. Advice only; the extender refuses such a pod anyway.
        by_rank = sorted(available, key=lambda d: (per_gpu[d.gpu].index(d), d.gpu))
        chosen += [d for d in by_rank if d not in chosen]
        return chosen[:size]

    def _prefer_mig(
        self, resource: Resource, available: list[PluginDevice], must: list[PluginDevice], size: int
    ) -> list[PluginDevice]:
        chosen = list(must)
        decision = self._only_waiting(
            lambda dec: dec.mig is not None and dec.mig.profile == resource.mig_profile
        )
        if decision is not None and decision.mig is not None:
            slot = self._mig_slot(decision.mig.gpu_index, decision.mig.start)
            wanted = next((d for d in available if slot is not None and d.id == slot.uuid), None)
            if wanted is not None and wanted not in chosen:
                chosen.append(wanted)
        chosen += [d for d in available if d not in chosen]
        return chosen[:size]

    # -- Allocate ------------------------------------------------------------------------------------

    def _decision_gpus(self, decision: Decision) -> tuple[int, ...]:
        """The decision's GPUs as machine indices; by UUID when given (robust to reordering)."""
        if decision.gpu_uuids:
            index = {g.uuid: g.index for g in self.machine.gpus}
            return tuple(index[u] for u in decision.gpu_uuids if u in index)
        return tuple(i for i in decision.gpu_indices if 0 <= i < self.machine.gpu_count)

    def _mig_slot(self, gpu: int, start: int) -> MigSlot | None:
        return next((s for s in self._mig.get(gpu, ()) if s.start == start), None)

    def _allocate(self, resource: Resource, request: pb.AllocateRequest) -> pb.AllocateResponse:
        with self._allocate_lock:
            taken: set[tuple[str, str]] = set()
            responses = []
            for req in request.container_requests:
                pod, decision = self._pod_for(resource, list(req.devices_ids), taken)
                taken.add((pod.namespace, pod.name))
                try:
                    response = self._container_response(resource, pod, decision)
                except AllocationRefused as err:
                    self._mark(pod, {ANNOTATION_BIND_PHASE: BIND_PHASE_FAILED})
                    self._release_lock(pod)
                    raise AllocationRefused(f"pod {pod.namespace}/{pod.name}: {err}") from None
                assert pod.decision is not None  # _pod_for returns only pods with a decision
                inside = pod.decision.current_is_inside
                done = pod.decision.allocated + 1
                if done < pod.decision.slice_count:  # more of its containers come: the pod still waits
                    self._mark(pod, {ANNOTATION_ALLOCATED_CONTAINERS: str(done)})
                else:
                    marks = {ANNOTATION_BIND_PHASE: BIND_PHASE_ALLOCATED, ANNOTATION_ALLOCATED: "true"}
                    if pod.decision.containers:
                        marks[ANNOTATION_ALLOCATED_CONTAINERS] = str(done)
                    self._mark(pod, marks)
                    self._release_lock(pod)
                container = decision.container if pod.decision.containers else ""
                given = slice_holder(
                    response.envs, pod.namespace, pod=pod.name, container=container, inside=inside
                )
                self.record.add(pod.uid, given)
                log.info(
                    "allocated %s for pod %s/%s%s", resource.name, pod.namespace, pod.name,
                    f" container {decision.container}" if pod.decision.containers else "",
                )  # fmt: skip
                responses.append(response)
            return pb.AllocateResponse(container_responses=responses)

    def _release_lock(self, pod: PendingPod) -> None:
        """The pod's Allocate is answered: the next pod may be bound to this node (``k8s.node_lock``)."""
        try:
            self.pods.release_node_lock(self.node_name, pod.uid)
        except Exception as err:  # it frees itself: the extender sees the pod no longer waiting
            log.warning("could not release the node lock of pod %s/%s: %s", pod.namespace, pod.name, err)

    def _pod_for(
        self, resource: Resource, device_ids: list[str], taken: set[tuple[str, str]]
    ) -> tuple[PendingPod, Decision]:
        """The pod these device IDs are for, and the decision of its container this call allocates (the
        kubelet allocates a pod's containers one by one, in order: ``Decision.current``). The API passes
        no pod, so this holds only while exactly one pod on the node waits for an allocation: the kubelet
        calls Allocate for a pod it has been told is bound here and has not yet allocated, so that pod is
        in the (consistent) list of waiting pods, and if the list has one pod, it is that one. With more
        than one, any answer could be for the wrong pod: refused (the extender's node lock keeps it to
        one). The device IDs must then be of that pod's GPUs (shares) or its MIG instance."""
        devices = [self._by_id.get(i) for i in device_ids]
        if not devices or any(d is None for d in devices):
            unknown = next((i for i, d in zip(device_ids, devices, strict=True) if d is None), "")
            raise AllocationRefused(f"the kubelet asked for unknown device {unknown!r} of {resource.name}")
        try:
            pods = self.pods.allocating_pods(self.node_name)
        except Exception as err:
            raise AllocationRefused(f"cannot list the pods bound to node {self.node_name}: {err}") from None
        # Pods that wait for another kind of Allocate call (another resource, another device count) are
        # not this call's: the extender's node lock lets one pod per kind through (``k8s.node_lock``).
        # A pod without a decision to tell its kind by could be this call's.
        key = allocate_key(resource.name, len(device_ids))
        waiting = [
            p
            for p in pods
            if (p.namespace, p.name) not in taken and (not _placed(p) or decision_key(p.decision) == key)
        ]
        if not waiting:
            raise AllocationRefused(
                f"no pod bound to node {self.node_name} is waiting for {resource.name} devices "
                f"{', '.join(device_ids)}: the pod was not placed by the gpuslice scheduler (check its "
                "schedulerName; the gpuslice webhook sets it), or its decision annotations were removed"
            )
        if len(waiting) > 1:
            names = ", ".join(sorted(f"{p.namespace}/{p.name}" for p in waiting)[:5])
            raise AllocationRefused(
                f"{len(waiting)} pods wait for an allocation of {key} on node {self.node_name} at once "
                f"({names}); Allocate names no pod, so it cannot tell which one the kubelet admits, and "
                "refuses rather than give one the other's slice (the extender's node lock lets one pod "
                "at a time through for each resource and device count: see docs/kubernetes.md, the node "
                "lock)"
            )
        (pod,) = waiting
        problem, decision = "", pod.decision.current() if pod.decision is not None else None
        given = [d for d in devices if d is not None]
        if decision is None or decision.phase != BIND_PHASE_ALLOCATING:
            problem = (
                "it has no gpuslice decision (not placed by the gpuslice scheduler: check its schedulerName)"
                if decision is None
                else f"its bind-phase is {decision.phase!r}, not {BIND_PHASE_ALLOCATING!r}"
            )
        elif pod.decision is not None and pod.decision.current_is_inside and not resource.mig_profile:
            # An init container runs inside the first app container's slice, on the share devices the
            # kubelet picks among those it gives to the next containers (it reuses an init container's
            # devices): any of that slice's GPUs will do, as many as the init container asks for.
            decision = self._inside_slice(pod.decision, decision, given)
            if decision is None:
                problem = (
                    f"the kubelet's devices {', '.join(device_ids)} for init container "
                    f"{pod.decision.current().container!r} are not on its first GPU container's GPUs "
                    f"{pod.decision.gpu_indices}"
                )
        elif not self._fits(resource, given, decision):
            where = f"MIG {decision.mig}" if decision.mig else f"GPUs {decision.gpu_indices}"
            problem = f"the kubelet's devices {', '.join(device_ids)} are not of its decision's {where}"
        if problem or decision is None:
            self._mark(pod, {ANNOTATION_BIND_PHASE: BIND_PHASE_FAILED})
            self._release_lock(pod)
            raise AllocationRefused(f"pod {pod.namespace}/{pod.name}: {problem}")
        return pod, decision

    def _inside_slice(
        self, pod_decision: Decision, init: Decision, devices: list[PluginDevice]
    ) -> Decision | None:
        """An init container's decision on the GPUs of the kubelet's ``devices``, if they are as many
        as it asks for, on distinct GPUs of the pod's first slice (the one the decision's own keys
        describe); else None."""
        allowed = self._decision_gpus(pod_decision)
        gpus = [d.gpu for d in devices]
        wanted = len(init.gpu_uuids or init.gpu_indices)
        if len(gpus) != wanted or len(set(gpus)) != wanted or not set(gpus) <= set(allowed):
            return None
        ordered = tuple(g for g in allowed if g in gpus)
        uuids = tuple(self.machine.gpus[g].uuid for g in ordered)
        return replace(init, gpu_indices=ordered, gpu_uuids=uuids)

    def _fits(self, resource: Resource, devices: list[PluginDevice], decision: Decision) -> bool:
        """Are ``devices`` the decision's: its MIG instance, or one share of each of its GPUs?"""
        if resource.mig_profile:
            if decision.mig is None or decision.mig.profile != resource.mig_profile:
                return False
            slot = self._mig_slot(decision.mig.gpu_index, decision.mig.start)
            return slot is not None and {d.mig.uuid for d in devices if d.mig is not None} == {slot.uuid}
        return (
            decision.mig is None
            and len(decision.gpu_indices or decision.gpu_uuids) == len(devices)
            and set(self._decision_gpus(decision)) == {d.gpu for d in devices}
        )

    def _mark(self, pod: PendingPod, annotations: Mapping[str, str]) -> None:
        try:
            self.pods.annotate_pod(pod.namespace, pod.name, annotations)
        except Exception as err:
            # Unmarked, the same decision could be handed to the next container: refuse instead.
            raise AllocationRefused(
                f"could not record the allocation on pod {pod.namespace}/{pod.name}: {err}"
            ) from None

    def _container_response(
        self, resource: Resource, pod: PendingPod, decision: Decision
    ) -> pb.ContainerAllocateResponse:
        mig = None
        if decision.mig is not None:
            choice = decision.mig
            slot = self._mig_slot(choice.gpu_index, choice.start)
            if slot is None or slot.profile != choice.profile:
                raise AllocationRefused(
                    f"its decision names MIG {choice.profile} at slice {choice.start} on GPU "
                    f"{choice.gpu_index}, which this node does not have"
                )
            if not self._health[slot.uuid]:
                raise AllocationRefused(f"MIG device {slot.uuid} is unhealthy")
            gpus: tuple[int, ...] = (choice.gpu_index,)
            mig = MigAssignment(choice.gpu_index, choice.profile, choice.start)
        else:
            gpus = self._decision_gpus(decision)
            wanted = len(decision.gpu_uuids or decision.gpu_indices)
            if len(gpus) != wanted or not gpus:
                raise AllocationRefused(
                    f"its decision names GPUs {','.join(decision.gpu_uuids) or decision.gpu_indices} "
                    f"but node {self.node_name} has {', '.join(g.uuid for g in self.machine.gpus)}"
                )
            sick = [self.machine.gpus[g].uuid for g in gpus if not self._gpu_healthy[g]]
            if sick:
                raise AllocationRefused(f"GPU {sick[0]} is unhealthy")
        setup = container_slice(
            self.machine,
            sharing=self.sharing,
            state_dir=self.state_dir,
            minors=self._minors,
            namespace=pod.namespace,
            # one shim folder per slice: a pod where several containers ask gets one per container
            holder=slice_folder(
                pod.name, decision.container if pod.decision and pod.decision.containers else ""
            ),
            gpus=gpus,
            memory_bytes=decision.memory_mib * MiB,
            compute_percent=decision.cores_percent,
            mig=mig,
        )
        return pb.ContainerAllocateResponse(
            envs=setup.env,
            mounts=[
                pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in setup.mounts
            ],
            devices=[
                pb.DeviceSpec(container_path=path, host_path=self._device_host_path(path), permissions="rw")
                for path in setup.device_nodes
            ],
            cdi_devices=[pb.CDIDevice(name=f"{CDI_KIND}={name}") for name in setup.uuids],
        )

    def _device_host_path(self, path: str) -> str:
        if not self._simulated:
            return path
        try:
            return stand_in_device_node(self.state_dir / "dev", path)
        except OSError as err:
            raise AllocationRefused(
                f"cannot make the stand-in for {path} of this simulated node: {err}"
            ) from None


def _placed(pod: PendingPod) -> bool:
    """Does ``pod`` carry a decision waiting for Allocate (so its allocate key is known)?"""
    return pod.decision is not None and pod.decision.phase == BIND_PHASE_ALLOCATING
