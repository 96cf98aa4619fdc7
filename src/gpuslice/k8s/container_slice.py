"""What a container holding a GPU slice gets on a node: environment, mounts, device nodes, CDI names.

One answer for both node components: the device plugin's Allocate turns it into a
``ContainerAllocateResponse``, the DRA driver into the container edits of a CDI spec. The slice is
given as the scheduler gives it (GPUs, memory, compute percent, or a MIG assignment), so a share is
held to the same limits whichever API asked for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuslice.errors import UserError
from gpuslice.hardware.machine import Machine
from gpuslice.k8s.shim_mounts import HostMount, container_setup
from gpuslice.node.enforcement import SharingMode, SliceLimits, job_env, mig_device_uuid, softcap_dir
from gpuslice.observe.node_slices import SliceHolder
from gpuslice.scheduler.node_decisions import MigAssignment

__all__ = [
    "CONTROL_DEVICES",
    "K8S_SHARING",
    "ContainerSlice",
    "HostMount",
    "container_slice",
    "device_nodes",
    "pod_sharing",
    "slice_holder",
]

K8S_SHARING = (SharingMode.SOFT.value, SharingMode.SHIM.value)  # the sharing modes that work in pods


def pod_sharing(sharing: SharingMode | str) -> SharingMode:
    """A node plugin's --sharing (the device plugin's and the DRA driver's): one of ``K8S_SHARING``;
    UserError saying why otherwise."""
    if str(sharing) == SharingMode.MPS.value:
        raise UserError(
            "--sharing mps is not offered on Kubernetes: MPS needs its control daemon outside the "
            "node plugin's container and a host /dev/shm shared by the daemon and every pod, which "
            "this deployment does not set up; use soft (MIG instances are hard partitions on their own)"
        )
    if str(sharing) not in K8S_SHARING:
        raise UserError(
            f"--sharing {str(sharing)!r}: pods get {' or '.join(K8S_SHARING)} sharing of a GPU (MIG "
            "instances are devices of their own)"
        )
    return SharingMode(sharing)


# Device nodes every CUDA container needs besides its GPUs' /dev/nvidia<minor> (NVIDIA's plugin and
# container toolkit pass the same set).
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def device_nodes(minors: Sequence[int], gpus: Sequence[int]) -> list[str]:
    """The device nodes a container with ``gpus`` needs: each GPU's /dev/nvidia<minor> (``minors`` by
    GPU index, from ``gpu_minors``) and the control devices."""
    return [*(f"/dev/nvidia{minors[g]}" for g in gpus), *CONTROL_DEVICES]


@dataclass(frozen=True, slots=True)
class ContainerSlice:
    """The container side of one slice. ``uuids`` are the GPU (or MIG instance) UUIDs, the names NVIDIA's
    CDI specs give the devices; ``gpus`` the machine indices behind them."""

    env: dict[str, str]
    mounts: tuple[HostMount, ...]
    device_nodes: tuple[str, ...]
    uuids: tuple[str, ...]
    gpus: tuple[int, ...]


def container_slice(
    machine: Machine,
    *,
    sharing: SharingMode | str,
    state_dir: Path,
    minors: Sequence[int],
    namespace: str,
    holder: str,
    gpus: Sequence[int],
    memory_bytes: int = 0,
    compute_percent: int = 0,
    mig: MigAssignment | None = None,
    nvml: Any | None = None,
) -> ContainerSlice:
    """The slice ``holder`` (``shim_mounts.slice_folder``) of ``namespace``: ``gpus`` (machine indices)
    with ``memory_bytes`` each (0: all) and ``compute_percent`` of their SMs (0 or 100: no cap), or the
    MIG instance ``mig``. ``minors`` maps a GPU index to its /dev/nvidia<minor>. Writes the soft-cap file
    and, under shim sharing, the slice's shim folder (see ``shim_mounts``). ``nvml`` is a pynvml-like
    module for tests (a MIG UUID lookup)."""
    if mig is not None:
        limits = SliceLimits(mig_profile=mig.profile, tenant=namespace)
        gpus = (mig.gpu,)
        uuids: tuple[str, ...] = (mig_device_uuid(machine, mig.gpu, mig.profile, mig.start, nvml),)
    else:
        cores = compute_percent if 0 < compute_percent < 100 else 0
        limits = SliceLimits(gpu_memory_bytes=memory_bytes, compute_percent=cores, tenant=namespace)
        uuids = tuple(machine.gpus[g].uuid for g in gpus)
    env = job_env(sharing, limits, gpus, machine, state_dir, mig=mig, nvml=nvml)
    # NVIDIA's container runtime reads NVIDIA_VISIBLE_DEVICES to mount the devices; the device nodes
    # and CDI names do the same without it (a runtime with CDI, containerd 1.7+ / CRI-O 1.23+).
    env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
    mounts = []
    if "PYTHONPATH" in env:  # the soft cap: host directory the slice's environment points at
        cap = str(softcap_dir(state_dir))
        mounts.append(HostMount(cap, cap, read_only=True))
    mounts += container_setup(state_dir, namespace, holder, env)  # --sharing shim
    return ContainerSlice(env, tuple(mounts), tuple(device_nodes(minors, gpus)), uuids, tuple(gpus))


def slice_holder(
    env: Mapping[str, str], namespace: str, *, pod: str = "", container: str = "", claim: str = "",
    inside: bool = False,
) -> SliceHolder:  # fmt: skip
    """The slice a container was given, read back from the environment ``container_slice`` gave it (the
    variables of ``job_env``; the region only under shim sharing): what the node's metrics show as given."""
    region = env.get("GPUSLICE_SHIM_REGION")
    return SliceHolder(
        namespace=namespace,
        gpus=tuple(int(g) for g in env.get("GPUSLICE_GPUS", "").split(",") if g),
        memory_bytes=int(env.get("GPUSLICE_GPU_MEMORY_BYTES") or 0),
        compute_ratio=int(env.get("GPUSLICE_COMPUTE_PERCENT") or 100) / 100,
        region=Path(region) if region else None,
        pod=pod,
        container=container,
        claim=claim,
        inside=inside,
    )
