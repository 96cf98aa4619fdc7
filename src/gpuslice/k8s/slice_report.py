"""What ``kubectl gpuslice top`` and ``pods`` show: each node's GPUs with the slices held on them, and
each pod's slice, read from the API's JSON the way the extender reads it.

```text
nodes + pods (API JSON) ──► ClusterState (the extender's own: inventories, decisions, its ledger)
                              │ extender.snapshot.cluster_view: per GPU its slices, free memory and compute
                              ├─► top:  per GPU, what its slices hold and what is free
                              └─► pods: per pod asking for gpuslice.io, its slice, GPUs, node
usage (device plugin metrics, optional) ──► memory used and compute busy per pod and GPU
```

The ledger is built by the extender's own classes from the same annotations, and what a slice holds
and what is free are the dashboard's and the cluster metrics' definitions (``cluster_view``, from
``observe.cluster_metrics.tally_gpus``): a share its compute and memory limit; a whole GPU, or a share
without a memory limit, the GPU's whole memory; a MIG instance its compute and memory slices. A bound pod
the ledger cannot hold is counted as a conflict, as the extender counts it.
Pure: no I/O; the plugin reads the API (``k8s.cluster_reads``) and hands the JSON in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.errors import InvalidRequest, UserError
from gpuslice.k8s.annotations import (
    ANNOTATION_NODE,
    ANNOTATION_NODE_INVENTORY,
    BIND_PHASE_FAILED,
    NodeInventory,
    asks_for_gpuslice,
)
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.extender.cluster import pod_ask, pod_meta
from gpuslice.k8s.extender.kube import RELISTED, WatchEvent
from gpuslice.k8s.extender.snapshot import cluster_view
from gpuslice.k8s.extender.state import ClusterState
from gpuslice.k8s.usage import GpuUsage, UsageKey
from gpuslice.units import MiB
from gpuslice.workload.request import MILLI_PER_GPU

__all__ = [
    "ClusterReport",
    "GpuReport",
    "GpuSlice",
    "PodReport",
    "cluster_report",
    "inventory_nodes",
    "pod_reports",
    "require_installed",
]


@dataclass(frozen=True, slots=True)
class GpuSlice:
    """What one pod holds on one GPU (the module docstring's definition): ``memory_bytes`` (its limit,
    or the GPU's whole memory where it has none), ``compute_percent`` of the GPU; ``mig_profile`` for a
    MIG instance."""

    namespace: str
    pod: str
    memory_bytes: int
    compute_percent: float
    mig_profile: str = ""

    @property
    def kind(self) -> str:
        if self.mig_profile:
            return "mig"
        return "whole" if self.compute_percent >= 100 else "share"

    def text(self) -> str:
        """``MIG 1g.10gb`` / ``whole`` / ``4096 MiB, 30 %``: the slice in the CLI's words."""
        if self.mig_profile:
            return f"MIG {self.mig_profile}"
        if self.kind == "whole":
            return "whole"
        return f"{self.memory_bytes // MiB} MiB, {self.compute_percent:g} %"


@dataclass(frozen=True, slots=True)
class GpuReport:
    """One GPU of a node's inventory and what the ledger holds on it."""

    node: str
    index: int
    model: str
    memory_bytes: int
    healthy: bool
    mig: bool
    allocated_memory_bytes: int
    allocated_compute_percent: float
    slices: tuple[GpuSlice, ...]
    usage: GpuUsage | None  # None: not read for this node, or a slice on it has no usage series

    @property
    def free_memory_bytes(self) -> int:
        return max(0, self.memory_bytes - self.allocated_memory_bytes)

    @property
    def free_compute_percent(self) -> float:
        return max(0.0, 100.0 - self.allocated_compute_percent)


@dataclass(frozen=True, slots=True)
class PodReport:
    """One pod that asks for gpuslice.io resources: its ask, and where it is held if it is bound."""

    namespace: str
    name: str
    phase: str
    asks: str  # the ask in the CLI's words, one part per asking container ("; " between them)
    node: str  # "" while pending
    gpus: tuple[int, ...]
    slices: tuple[tuple[int, GpuSlice], ...]  # (GPU, slice) the ledger holds (none: pending, not held)
    usage: GpuUsage | None
    problem: str = ""  # why it is not in the ledger, or its ask cannot be read


@dataclass(frozen=True, slots=True)
class ClusterReport:
    """Every GPU of the nodes with a readable inventory, in node and index order, and what was left out."""

    gpus: tuple[GpuReport, ...]
    unreadable: tuple[str, ...]  # "node X: why" / "NS/POD: why" for what the extender skips too
    conflicts: int  # slices of bound pods the ledger could not hold (placed from outside gpuslice)


def inventory_nodes(nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The nodes that carry gpuslice's inventory annotation: gpuslice is installed where there is one."""
    return [
        n for n in nodes if ANNOTATION_NODE_INVENTORY in ((n.get("metadata") or {}).get("annotations") or {})
    ]


def require_installed(nodes: Sequence[Mapping[str, Any]]) -> None:
    """UserError unless gpuslice is installed, judged by its one visible mark: a node carrying the
    inventory annotation its device plugin publishes on each GPU node. gpuslice has no CRD, and the chart
    may be installed in any namespace, so a namespace says nothing."""
    if not inventory_nodes(nodes):
        raise UserError(
            f"gpuslice is not installed in this cluster: no node carries the {ANNOTATION_NODE_INVENTORY} "
            "annotation (gpuslice's device plugin publishes it on each GPU node it runs on); install "
            "gpuslice and label the GPU nodes gpuslice.io/gpu-node=true (docs/kubernetes.md)"
        )


def _view(
    nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], int]:
    """The extender's cluster view over these objects, as its first full lists would build it, and the
    bound pods its ledger could not hold. Its API is never called here: events, binds and evictions are
    the extender's, and this only reads."""
    state = ClusterState(api=None)  # type: ignore[arg-type]  # read-only: no Event, no Binding
    for kind, items in (("Node", nodes), ("Pod", pods)):
        for item in items:
            state.apply(WatchEvent(kind, "ADDED", item))
        state.apply(WatchEvent(kind, RELISTED, {"items": list(items)}))
    return cluster_view(state), state.conflicts


def _gpu_slices(gpu: Mapping[str, Any]) -> list[GpuSlice]:
    out = []
    for held in gpu["slices"]:
        namespace, _, name = str(held["pod"]).partition("/")
        percent = 100 * held["milli"] / MILLI_PER_GPU
        out.append(GpuSlice(namespace, name, held["memory_mib"] * MiB, percent, held["mig_profile"] or ""))
    return sorted(out, key=lambda s: (s.namespace, s.pod))


def cluster_report(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    usage: Mapping[str, Mapping[UsageKey, GpuUsage]] | None = None,
) -> ClusterReport:
    """Every GPU of every node with an inventory, with the slices of ``pods`` bound there. ``usage``:
    per node whose device plugin could be read, its pods' usage per GPU."""
    view, conflicts = _view(nodes, pods)
    inventories, unreadable = _inventories(nodes)
    gpus: list[GpuReport] = []
    for node in view["nodes"]:
        name = node["name"]
        node_usage = None if usage is None else usage.get(name)
        for gpu in node["gpus"]:
            memory = gpu["memory_mib"] * MiB
            slices = tuple(_gpu_slices(gpu))
            gpus.append(
                GpuReport(
                    node=name,
                    index=gpu["index"],
                    model=_model(inventories.get(name), gpu["index"], node["model"]),
                    memory_bytes=memory,
                    healthy=gpu["healthy"],
                    mig=gpu["mig"],
                    # free is 0 where no pod may land (an unhealthy GPU): all of it counts as taken
                    allocated_memory_bytes=memory - gpu["memory_free_mib"] * MiB,
                    allocated_compute_percent=100 * (MILLI_PER_GPU - gpu["milli_free"]) / MILLI_PER_GPU,
                    slices=slices,
                    usage=None if node_usage is None else _gpu_total(node_usage, gpu["index"], slices),
                )
            )
    unreadable += [
        f"{namespace}/{name}: {err}; not counted" for namespace, name, err in _unreadable_pods(pods)
    ]
    return ClusterReport(gpus=tuple(gpus), unreadable=tuple(unreadable), conflicts=conflicts)


def _inventories(nodes: Sequence[Mapping[str, Any]]) -> tuple[dict[str, NodeInventory], list[str]]:
    """Each node's readable inventory by name, and "node X: why" for each one the extender skips too."""
    readable, unreadable = {}, []
    for node in inventory_nodes(nodes):
        name = str((node.get("metadata") or {}).get("name", ""))
        try:
            readable[name] = NodeInventory.from_json(
                str(node["metadata"]["annotations"][ANNOTATION_NODE_INVENTORY])
            )
        except InvalidRequest as err:
            unreadable.append(f"node {name}: {err}")
    return readable, unreadable


def _model(inventory: NodeInventory | None, index: int, node_model: str) -> str:
    """The GPU's own model in the inventory (the ledger keeps one per node: its first GPU's)."""
    models = {g.index: g.model for g in inventory.gpus} if inventory is not None else {}
    return models.get(index, node_model)


def _unreadable_pods(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, InvalidRequest]]:
    """Bound pods whose decision or ask the extender cannot read (it logs them and leaves them out)."""
    out = []
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if ANNOTATION_NODE not in annotations or _phase(pod) in ("Succeeded", "Failed"):
            continue
        try:
            Decision.from_annotations(annotations)
            pod_ask(pod)
        except InvalidRequest as err:
            namespace, name, _ = pod_meta(pod)
            out.append((namespace, name, err))
    return out


def _gpu_total(usage: Mapping[UsageKey, GpuUsage], gpu: int, slices: Sequence[GpuSlice]) -> GpuUsage | None:
    """What the GPU's slices use, summed: None when one of them has no usage series (its node's plugin
    reads usage from the shim's regions, which sharing without the shim does not have)."""
    return GpuUsage.total(usage.get(UsageKey(s.namespace, s.pod, gpu)) for s in slices)


def pod_reports(
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]] | None,
    usage: Mapping[str, Mapping[UsageKey, GpuUsage]] | None = None,
) -> list[PodReport]:
    """Each of ``pods`` that asks for gpuslice.io resources and has not ended, in namespace and name
    order. ``nodes``: to hold the bound ones in the ledger (their slices); None when they cannot be read:
    each pod's GPUs from its decision alone, and nothing said about the ledger."""
    asking = [p for p in pods if asks_for_gpuslice(p) and _phase(p) not in ("Succeeded", "Failed")]
    view, _ = _view(nodes, asking) if nodes is not None else ({"nodes": []}, 0)
    held: dict[tuple[str, str], list[tuple[int, GpuSlice]]] = {}
    for node in view["nodes"]:
        for gpu in node["gpus"]:
            for one in _gpu_slices(gpu):
                held.setdefault((one.namespace, one.pod), []).append((gpu["index"], one))
    out = []
    for pod in asking:
        namespace, name, _ = pod_meta(pod)
        problem, asks, decision = "", "", None
        try:
            asks = "; ".join(c.text() for c in pod_ask(pod).containers)
            decision = Decision.from_annotations((pod.get("metadata") or {}).get("annotations") or {})
        except InvalidRequest as err:
            problem = str(err)
        node = decision.node if decision else str((pod.get("spec") or {}).get("nodeName") or "")
        slices = held.get((namespace, name), [])
        if node and not problem and not slices and nodes is not None:
            problem = _not_held(decision)
        gpus = tuple(sorted({g for g, _ in slices})) or _decided_gpus(decision)
        node_usage = None if usage is None or not node else usage.get(node)
        used = None
        if node_usage is not None and gpus:
            used = GpuUsage.total(node_usage.get(UsageKey(namespace, name, g)) for g in gpus)
        out.append(
            PodReport(
                namespace=namespace,
                name=name,
                phase=_phase(pod),
                asks=asks,
                node=node,
                gpus=gpus,
                slices=tuple(slices),
                usage=used,
                problem=problem,
            )
        )
    return sorted(out, key=lambda p: (p.namespace, p.name))


def _not_held(decision: Decision | None) -> str:
    if decision is None:
        return "bound without a gpuslice decision (not placed by the gpuslice scheduler)"
    if decision.phase == BIND_PHASE_FAILED:
        return "the device plugin could not honour its decision (bind-phase failed)"
    return (
        f"not in the ledger: node {decision.node} has no gpuslice inventory, or its slice does not fit there"
    )


def _decided_gpus(decision: Decision | None) -> tuple[int, ...]:
    if decision is None:
        return ()
    if decision.mig is not None:
        return (decision.mig.gpu_index,)
    return tuple(sorted({*decision.gpu_indices, *(g for c in decision.containers for g in c.gpu_indices)}))


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")
