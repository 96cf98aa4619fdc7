"""The ResourceSlices one node publishes (resource.k8s.io/v1): one pool per node, named after the node.

```text
pool <node>, generation g, resourceSliceCount = 1 + device slices
  slice <node>-counters-<k>  sharedCounters: a set per MIG-mode GPU (memory-slice-0..7, compute-slices)
  slice <node>-gpu-<i>       devices of GPU i:
      gpu-<i>                    (MIG off) allowMultipleAllocations, consumable memory + cores
      gpu-<i>-mig-<profile>-<s>  (MIG on)  every placement of every profile, consuming the GPU's counters
```

Only one of ``devices`` and ``sharedCounters`` may be set in one slice, and a slice whose devices
consume counters holds at most 64 devices, so each GPU gets its own device slice (an H100's MIG
geometry alone has 18 placements). A shared GPU's consumable capacity:

| capacity | value | request policy |
|---|---|---|
| ``memory`` | the GPU's memory | default: all of it (aligned), valid: 256 MiB steps from 256 MiB |
| ``cores`` | 100 (percent of the SMs) | default 100, valid: whole percent from 1 |

So a claim that names no capacity takes the whole GPU, and one that asks for 10 GiB and 30 cores
shares it with others until the sums reach the values. An unhealthy GPU (an XID) publishes no
devices: republishing with a higher generation takes it out of every new allocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.mig import MEMORY_SLICES, MigProfile, mig_gpu
from gpuslice.k8s import quantity
from gpuslice.k8s.dra.identity import GpuIdentity
from gpuslice.units import MiB

__all__ = [
    "API_VERSION",
    "ATTR_PCIE_ROOT",
    "ATTR_PCI_BUS_ID",
    "CAPACITY_CORES",
    "CAPACITY_MEMORY",
    "COMPUTE_COUNTER",
    "COUNTER_SET_LIMIT",
    "DRIVER",
    "MEMORY_MIN_MIB",
    "MEMORY_STEP_MIB",
    "TYPE_GPU",
    "TYPE_MIG",
    "MigDevice",
    "counter_set_name",
    "gpu_device_name",
    "memory_default_mib",
    "mig_device_name",
    "mig_devices",
    "node_slices",
    "parse_mig_device_name",
]

API_VERSION = "resource.k8s.io/v1"
DRIVER = "gpu.gpuslice.io"  # the DRA driver name: a DNS subdomain, also the attribute domain
TYPE_GPU = "gpu"
TYPE_MIG = "mig"
CAPACITY_MEMORY = "memory"
CAPACITY_CORES = "cores"
COMPUTE_COUNTER = "compute-slices"
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ATTR_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
MEMORY_MIN_MIB = 256
MEMORY_STEP_MIB = 256
CORES_FULL = 100
COUNTER_SET_LIMIT = 8  # counter sets per slice (ResourceSliceMaxCounterSets)


def gpu_device_name(gpu: int) -> str:
    return f"gpu-{gpu}"


def counter_set_name(gpu: int) -> str:
    return f"gpu-{gpu}"


def mig_device_name(gpu: int, profile: MigProfile, start: int) -> str:
    """ "gpu-0-mig-1g-10gb-me-3": a DNS label (no dots, no plus) that names GPU, profile and start."""
    return f"gpu-{gpu}-mig-{profile.name.replace('.', '-').replace('+', '-')}-{start}"


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG placement a device stands for: GPU index, profile and first memory slice."""

    gpu: int
    profile: MigProfile
    start: int

    @property
    def name(self) -> str:
        return mig_device_name(self.gpu, self.profile, self.start)


def mig_devices(machine: Machine, gpu: int) -> tuple[MigDevice, ...]:
    """Every placement of every profile on MIG-mode GPU ``gpu``, as the MIG geometry allows."""
    table = mig_gpu(machine.gpus[gpu].mig_model)
    return tuple(MigDevice(gpu, p, s) for p in table.profiles for s in p.starts)


def parse_mig_device_name(machine: Machine, name: str) -> MigDevice | None:
    """The ``MigDevice`` a published device name stands for, or None (not a MIG device of this node)."""
    head, sep, _ = name.partition("-mig-")
    if not sep or not head.startswith("gpu-") or not head[4:].isdigit():
        return None
    gpu = int(head[4:])
    if gpu >= machine.gpu_count or not machine.gpus[gpu].mig_enabled:
        return None
    return next((d for d in mig_devices(machine, gpu) if d.name == name), None)


def memory_default_mib(memory_bytes: int) -> int:
    """The most memory a claim can take on one GPU: min + n steps, at most the GPU's memory."""
    total = memory_bytes // MiB
    return MEMORY_MIN_MIB + (total - MEMORY_MIN_MIB) // MEMORY_STEP_MIB * MEMORY_STEP_MIB


def consumed_share(consumed: Mapping[str, Any], full_mib: int) -> tuple[int, int]:
    """(MiB, cores %) an allocation result's ``consumedCapacity`` takes of a shared GPU: what it names,
    else all of the memory (``full_mib``) and 100 %. InvalidRequest for a value that is no quantity."""
    mib, cores = full_mib, 100
    if CAPACITY_MEMORY in consumed:
        mib = quantity.bytes_as_mib(consumed[CAPACITY_MEMORY], CAPACITY_MEMORY)
    if CAPACITY_CORES in consumed:
        cores = quantity.whole_count(consumed[CAPACITY_CORES], CAPACITY_CORES)
    return mib, cores


def _attributes(
    machine: Machine, gpu: GpuInfo, identity: GpuIdentity, kind: str
) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {
        "type": {"string": kind},
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "productName": {"string": gpu.model},
        "memoryMiB": {"int": gpu.memory_bytes // MiB},
    }
    topology = machine.topology
    if topology is not None:
        if topology.numa[gpu.index] >= 0:
            attrs["numaNode"] = {"int": topology.numa[gpu.index]}
        domain = next(i for i, g in enumerate(topology.nvlink_groups()) if gpu.index in g)
        attrs["nvlinkDomain"] = {"int": domain}
    if identity.compute_capability:
        attrs["cudaComputeCapability"] = {"version": f"{identity.compute_capability}.0"}
    if identity.pci_bus_id:
        attrs[ATTR_PCI_BUS_ID] = {"string": identity.pci_bus_id}
    if identity.pcie_root:
        attrs[ATTR_PCIE_ROOT] = {"string": identity.pcie_root}
    return attrs


def _shared_gpu(machine: Machine, gpu: GpuInfo, identity: GpuIdentity) -> dict[str, Any]:
    mib = gpu.memory_bytes // MiB
    return {
        "name": gpu_device_name(gpu.index),
        "attributes": _attributes(machine, gpu, identity, TYPE_GPU),
        "allowMultipleAllocations": True,
        "capacity": {
            CAPACITY_MEMORY: {
                "value": f"{mib}Mi",
                "requestPolicy": {
                    "default": f"{memory_default_mib(gpu.memory_bytes)}Mi",
                    "validRange": {"min": f"{MEMORY_MIN_MIB}Mi", "step": f"{MEMORY_STEP_MIB}Mi"},
                },
            },
            CAPACITY_CORES: {
                "value": str(CORES_FULL),
                "requestPolicy": {"default": str(CORES_FULL), "validRange": {"min": "1", "step": "1"}},
            },
        },
    }


def _mig_device(machine: Machine, gpu: GpuInfo, identity: GpuIdentity, device: MigDevice) -> dict[str, Any]:
    attrs = _attributes(machine, gpu, identity, TYPE_MIG)
    attrs["migProfile"] = {"string": device.profile.name}
    attrs["migStart"] = {"int": device.start}
    slices = range(device.start, device.start + device.profile.memory_slices)
    counters = {f"memory-slice-{k}": {"value": "1"} for k in slices}
    counters[COMPUTE_COUNTER] = {"value": str(device.profile.compute_slices)}
    return {
        "name": device.name,
        "attributes": attrs,
        "capacity": {CAPACITY_MEMORY: {"value": f"{device.profile.memory_bytes // MiB}Mi"}},
        "consumesCounters": [{"counterSet": counter_set_name(gpu.index), "counters": counters}],
    }


def _counter_set(gpu: GpuInfo) -> dict[str, Any]:
    compute = max(p.compute_slices for p in mig_gpu(gpu.mig_model).profiles)
    counters = {f"memory-slice-{k}": {"value": "1"} for k in range(MEMORY_SLICES)}
    counters[COMPUTE_COUNTER] = {"value": str(compute)}
    return {"name": counter_set_name(gpu.index), "counters": counters}


def node_slices(
    machine: Machine,
    node_name: str,
    *,
    generation: int,
    identities: Mapping[int, GpuIdentity] | None = None,
    healthy: Mapping[int, bool] | None = None,
) -> list[dict[str, Any]]:
    """The ResourceSlice objects of ``node_name``'s pool at ``generation`` (ready to create).

    Unhealthy GPUs (``healthy[i]`` False) keep their slice, empty, so the pool's slice count stays put
    while they are out. Slice names are ``<node>-counters-<k>`` (8 sets each) and ``<node>-gpu-<i>``."""
    identities = identities or {}
    healthy = healthy or {}
    mig_gpus = [g for g in machine.gpus if g.mig_enabled]
    specs: list[tuple[str, dict[str, Any]]] = []
    for k in range(0, len(mig_gpus), COUNTER_SET_LIMIT):
        sets = [_counter_set(g) for g in mig_gpus[k : k + COUNTER_SET_LIMIT]]
        specs.append((f"counters-{k // COUNTER_SET_LIMIT}", {"sharedCounters": sets}))
    for g in machine.gpus:
        identity = identities.get(g.index, GpuIdentity())
        devices: list[dict[str, Any]] = []
        if healthy.get(g.index, True):
            if g.mig_enabled:
                devices = [_mig_device(machine, g, identity, d) for d in mig_devices(machine, g.index)]
            else:
                devices = [_shared_gpu(machine, g, identity)]
        specs.append((gpu_device_name(g.index), {"devices": devices}))
    slices = []
    for suffix, body in specs:
        spec: dict[str, Any] = {
            "driver": DRIVER,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(specs)},
            "nodeName": node_name,
            **body,
        }
        slices.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {
                    "name": f"{node_name}-{suffix}",
                    "labels": {"app.kubernetes.io/name": "gpuslice"},
                },
                "spec": spec,
            }
        )
    return slices
