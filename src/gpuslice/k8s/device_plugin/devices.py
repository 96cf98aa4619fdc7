"""What the device plugin advertises and hands out: devices, the node inventory and labels, device nodes."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpuslice.errors import UserError
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import MigLayout, mig_gpu, parse_layout
from gpuslice.k8s.annotations import (
    InventoryGpu,
    MigSlot,
    NodeInventory,
)
from gpuslice.node.enforcement import mig_device_uuid
from gpuslice.units import MiB

__all__ = [
    "CDI_KIND",
    "CONTROL_DEVICES",
    "HEALTHY",
    "LABEL_COUNT",
    "LABEL_MEMORY",
    "LABEL_MIG_CAPABLE",
    "LABEL_PRODUCT",
    "MAX_DEVICE_ID_CHARS",
    "SHARE_SEPARATOR",
    "UNHEALTHY",
    "PluginDevice",
    "Resource",
    "default_mig_layouts",
    "device_nodes",
    "gpu_minors",
    "gpu_numa",
    "gpu_of_share",
    "mig_health_keys",
    "node_inventory",
    "node_labels",
    "nvml_mig_layouts",
    "parse_mig_layouts",
    "stand_in_device_node",
]

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

# Replica ids as NVIDIA's time-slicing builds them (k8s-device-plugin ``internal/rm/devices.go``,
# NewAnnotatedID): "<uuid>::<k>".
SHARE_SEPARATOR = "::"
MAX_DEVICE_ID_CHARS = 63  # Device.ID limit in api.proto
# GPU feature discovery's node labels (NVIDIA gpu-feature-discovery: nvidia.com/gpu.product, …), under
# our domain so they never clash with GFD running beside us.
LABEL_PRODUCT = "gpuslice.io/gpu.product"
LABEL_MEMORY = "gpuslice.io/gpu.memory"  # MiB of the first GPU, as GFD
LABEL_COUNT = "gpuslice.io/gpu.count"
LABEL_MIG_CAPABLE = "gpuslice.io/mig.capable"
# Device nodes every CUDA container needs besides its GPUs' /dev/nvidia<minor> (NVIDIA's plugin and
# container toolkit pass the same set).
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
CDI_KIND = "nvidia.com/gpu"  # the CDI kind nvidia-ctk generates; devices named by GPU or MIG UUID


@dataclass(frozen=True, slots=True)
class PluginDevice:
    """One device the kubelet sees: a share of a GPU, or one MIG instance."""

    id: str
    gpu: int  # machine index of the physical GPU
    numa: int  # -1 if unknown
    mig: MigSlot | None = None


def gpu_of_share(device_id: str) -> str:
    """``GPU-abc::3`` -> ``GPU-abc``: the physical GPU behind a share id."""
    return device_id.split(SHARE_SEPARATOR, 1)[0]


def default_mig_layouts(machine: Machine) -> dict[int, MigLayout]:
    """The layout a simulated MIG GPU starts with: its half-GPU 3g profile at slices 0 and 4.

    A real GPU's layout is read from NVML (``hardware.mig_nvml.read_layout``); gpuslice does not create
    MIG instances (that needs root), so simulated nodes need some instances to advertise."""
    layouts = {}
    for g in machine.gpus:
        if g.mig_enabled:
            table = mig_gpu(g.mig_model)
            half = next(p for p in table.profiles if p.name.startswith("3g."))
            layouts[g.index] = parse_layout(table, f"{half.name}@0/1,{half.name}@4/2")
    return layouts


def gpu_numa(machine: Machine, gpu: int) -> int:
    return machine.topology.numa[gpu] if machine.topology is not None else -1


def node_inventory(
    machine: Machine, split_count: int, mig: Mapping[int, Sequence[MigSlot]], healthy: Mapping[int, bool]
) -> NodeInventory:
    """What the extender needs to know about this node (``annotations.NodeInventory``)."""
    topo = machine.topology
    labels: tuple[tuple[str, ...], ...] = ()
    if topo is not None:
        labels = tuple(tuple(topo.label(i, j) for j in range(topo.n_gpus)) for i in range(topo.n_gpus))
    gpus = tuple(
        InventoryGpu(
            index=g.index,
            uuid=g.uuid,
            model=g.model,
            memory_mib=g.memory_bytes // MiB,
            healthy=healthy.get(g.index, True),
            mig=tuple(mig.get(g.index, ())),
        )
        for g in machine.gpus
    )
    return NodeInventory(gpus=gpus, topology=labels, split_count=split_count)


@dataclass
class Resource:
    name: str  # gpuslice.io/gpu or gpuslice.io/mig-<profile>
    endpoint: str  # socket file name inside socket_dir
    devices: list[PluginDevice]
    mig_profile: str = ""
    server: grpc.Server | None = field(default=None, repr=False)


def _label_value(text: str) -> str:
    """A label value: at most 63 of [A-Za-z0-9_.-], starting and ending alphanumeric (GFD writes
    "NVIDIA-H100-80GB-HBM3" for "NVIDIA H100 80GB HBM3" the same way)."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "-" for c in text)[:63]
    return cleaned.strip("_.-")


def node_labels(machine: Machine) -> dict[str, str]:
    """GPU feature discovery's labels, under gpuslice.io/: product, memory (MiB), count, MIG capable."""
    if not machine.gpus:
        return {LABEL_COUNT: "0"}
    first = machine.gpus[0]
    return {
        LABEL_PRODUCT: _label_value(first.model),
        LABEL_MEMORY: str(first.memory_bytes // MiB),
        LABEL_COUNT: str(len(machine.gpus)),
        LABEL_MIG_CAPABLE: "true" if any(g.mig_model for g in machine.gpus) else "false",
    }


def device_nodes(minors: Sequence[int], gpus: Sequence[int]) -> list[str]:
    """The device nodes a container with ``gpus`` needs: each GPU's /dev/nvidia<minor> (``minors`` by
    GPU index, from ``gpu_minors``) and the control devices."""
    return [*(f"/dev/nvidia{minors[g]}" for g in gpus), *CONTROL_DEVICES]


def stand_in_device_node(folder: Path, path: str) -> str:
    """The host file that stands in for the device node ``path`` on a simulated node, which has no
    NVIDIA driver and so no /dev/nvidia*: a character device with /dev/null's numbers at
    ``folder``/<name>, made once. The runtime passes it into the container at ``path`` (the kubelet
    refuses a device spec whose host path does not exist); opened, it reads nothing."""
    target = Path(folder) / Path(path).name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(target, 0o666 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)
    return str(target)


def gpu_minors(machine: Machine) -> tuple[int, ...]:
    """Each GPU's /dev/nvidia<minor>: NVML's minor number, which need not equal its index (read once,
    when the plugin starts); the index where NVML cannot say (a simulated machine)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML: indices are the minors there
        return tuple(g.index for g in machine.gpus)
    try:
        minors = []
        for g in machine.gpus:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(g.uuid)
                minors.append(int(pynvml.nvmlDeviceGetMinorNumber(handle)))
            except Exception:  # a GPU NVML does not know (a simulated UUID)
                minors.append(g.index)
        return tuple(minors)
    finally:
        pynvml.nvmlShutdown()


def parse_mig_layouts(machine: Machine, texts: Sequence[str]) -> dict[int, MigLayout]:
    """``["0=3g.40gb@0/1,3g.40gb@4/2", "1=7g.80gb@0/0"]`` -> layouts of those MIG-mode GPUs."""
    layouts = {}
    for text in texts:
        index, sep, layout = text.partition("=")
        if not sep or not index.strip().isdigit():
            raise UserError(f"--mig-layout {text!r}: write GPU=LAYOUT, e.g. 0=3g.40gb@0/1,3g.40gb@4/2")
        gpu = int(index)
        if gpu >= machine.gpu_count or not machine.gpus[gpu].mig_enabled:
            raise UserError(f"--mig-layout {text!r}: GPU {gpu} is not a MIG-mode GPU of {machine.name}")
        layouts[gpu] = parse_layout(mig_gpu(machine.gpus[gpu].mig_model), layout)
    return layouts


def nvml_mig_layouts(machine: Machine) -> dict[int, MigLayout]:
    from gpuslice.hardware.mig_nvml import read_layout

    return {g.index: read_layout(g.index) for g in machine.gpus if g.mig_enabled}


def mig_health_keys(machine: Machine, layouts: Mapping[int, MigLayout]) -> dict[tuple[str, int, int], str]:
    """(GPU UUID, GI id, CI id) -> MIG device UUID, so an XID inside one instance marks only it."""
    keys = {}
    for gpu, layout in layouts.items():
        for instance in layout.instances:
            if instance.gi_id is None:
                continue
            uuid = mig_device_uuid(machine, gpu, instance.profile.name, instance.start)
            for ci in instance.ci_ids:
                keys[(machine.gpus[gpu].uuid, instance.gi_id, ci)] = uuid
    return keys
