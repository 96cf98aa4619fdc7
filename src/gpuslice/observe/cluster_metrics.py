"""Cluster metrics from a ledger: per node what pods hold and what is left, pods pending by reason code,
preemptions. Two homes export the same families from their own ledger, each in its own process:

```text
scheduler extender  GET /metrics on its port: the nodes with a gpuslice inventory (k8s/extender/snapshot.py)
DRA allocator       GET /metrics on --metrics-port (off by default): its ResourceSlice pools, one node each
```

Per node, label ``node`` (the Kubernetes node name; a DRA pool is named after its node), 6 series:

```text
gpuslice_cluster_node_gpus{node, model}               GPUs the node advertises
gpuslice_cluster_node_gpus_allocated{node}            GPUs given to pods, fractional: milli-GPU / 1000
gpuslice_cluster_node_gpu_memory_bytes{node}          GPU memory in total
gpuslice_cluster_node_gpu_memory_allocated_bytes{node} GPU memory given to pods
gpuslice_cluster_node_gpu_unallocated_ratio{node}     free GPU capacity pods may still get, 0-1 of the GPUs
gpuslice_cluster_node_gpu_fragmentation_ratio{node}   FGD's fragmented capacity, 0-1 of the GPUs
```

and for the cluster, bounded by the fixed reason codes (``PENDING_REASONS``), never per pod:
``gpuslice_cluster_pending_pods{reason}`` (every code, zeros included),
``gpuslice_cluster_pending_longest_wait_seconds{reason}`` (the codes some pod waits with) and
``gpuslice_cluster_preemptions_total``: 1,000 nodes are 6,000 series, and 21 to 41 more. A node that
leaves the ledger leaves the next scrape: every family is built afresh at each scrape, nothing is kept.

What a pod holds (``tally_gpus``), per GPU: a share its compute (milli-GPU) and its memory limit; a whole
GPU, or a share without a memory limit, the GPU's whole memory (nothing fences it below that); a MIG
instance its compute and memory slices as serve counts them (``ledger.mig.mig_request``). A GPU's
memory counts at most once. Unallocated: what is left on GPUs a pod may land on (healthy, not in MIG
mode) and on MIG GPUs; an unhealthy GPU is neither allocated nor unallocated. Fragmentation is FGD's
measure (``ledger.fragmentation``, Weng et al., USENIX ATC '23) against the home's target workload, as
a share of the node's GPU capacity, as ``gpuslice sim`` reports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gpuslice.ledger.fragmentation import FragmentationMeasure
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.mig import mig_request
from gpuslice.ledger.placement import Placement, RefusalCode
from gpuslice.workload.request import MILLI_PER_GPU, Request
from gpuslice.workload.target import TargetWorkload

__all__ = [
    "INVALID_REQUEST",
    "PENDING_REASONS",
    "WHOLE_GPU_TARGET",
    "ClusterCollector",
    "ClusterFigures",
    "GpuTally",
    "ledger_figures",
    "pending_by_reason",
    "tally_gpus",
]

# A pod whose gpuslice request itself is invalid waits with this code: no node is judged for it.
INVALID_REQUEST = "invalid_request"
# Every reason a pending pod can carry: the refusal codes every home shares, and the invalid request.
PENDING_REASONS: tuple[str, ...] = (*(code.label for code in RefusalCode), INVALID_REQUEST)
# Fragmentation before a home knows any pod's shape: against a pod of one whole GPU, the free capacity on
# GPUs a share has started is what is fragmented.
WHOLE_GPU_TARGET = TargetWorkload.from_requests([Request(0, num_gpu=1, gpu_milli=MILLI_PER_GPU)])


@dataclass(frozen=True, slots=True)
class GpuTally:
    """Per GPU slot of a ledger, (N, G) int64 arrays: what pods hold and what is left (module doc); and
    each slice, one per placement and GPU, as flat arrays in the placements' order."""

    allocated_milli: np.ndarray
    allocated_memory_bytes: np.ndarray
    unallocated_milli: np.ndarray
    slices: np.ndarray  # placements holding part of it, MIG instances included
    slice_of: np.ndarray  # (S,) index of the slice's placement in the placements given
    slice_node: np.ndarray  # (S,)
    slice_gpu: np.ndarray  # (S,)
    slice_milli: np.ndarray  # (S,)
    slice_memory_bytes: np.ndarray  # (S,) its limit; the GPU's whole memory where it has none


def tally_gpus(
    placements: Sequence[Placement],
    memory_capacity_bytes: np.ndarray,
    open_gpus: np.ndarray,
    mig_gpus: np.ndarray | None = None,
) -> GpuTally:
    """``placements``: the pods' placements (a home's own holds, such as the extender's blockers on MIG
    and unhealthy GPUs, left out); ``memory_capacity_bytes`` (N, G); ``open_gpus`` (N, G) bool: GPUs a
    share may land on; ``mig_gpus`` (N, G) bool: GPUs in MIG mode whose instances are counted. One
    Python step per placement and GPU, the sums in numpy (10,000 pods: a few milliseconds)."""
    of: list[int] = []
    nodes: list[int] = []
    gpus: list[int] = []
    milli: list[int] = []
    memory: list[int] = []  # 0: no limit, the GPU's whole memory
    for k, p in enumerate(placements):
        if p.mig is not None:
            r = mig_request(p.mig.instance.profile, int(memory_capacity_bytes[p.node, p.mig.gpu]))
            of.append(k)
            nodes.append(p.node)
            gpus.append(p.mig.gpu)
            milli.append(r.gpu_milli)
            memory.append(r.gpu_memory_bytes)
            continue
        r = p.request
        for g in p.gpus:
            of.append(k)
            nodes.append(p.node)
            gpus.append(g)
            milli.append(r.gpu_milli)
            memory.append(r.gpu_memory_bytes)
    shape = memory_capacity_bytes.shape
    at = (np.array(nodes, dtype=np.int64), np.array(gpus, dtype=np.int64))
    asked = np.array(memory, dtype=np.int64)
    slice_milli = np.array(milli, dtype=np.int64)
    slice_memory = np.where(asked > 0, asked, memory_capacity_bytes[at])
    allocated_milli = np.zeros(shape, dtype=np.int64)
    allocated_memory = np.zeros(shape, dtype=np.int64)
    slices = np.zeros(shape, dtype=np.int64)
    np.add.at(allocated_milli, at, slice_milli)
    np.add.at(allocated_memory, at, slice_memory)
    np.add.at(slices, at, 1)
    allocated_memory = np.minimum(allocated_memory, memory_capacity_bytes)
    usable = open_gpus if mig_gpus is None else open_gpus | mig_gpus
    unallocated = np.where(usable, np.maximum(MILLI_PER_GPU - allocated_milli, 0), 0)
    return GpuTally(
        allocated_milli, allocated_memory, unallocated, slices,
        np.array(of, dtype=np.int64), at[0], at[1], slice_milli, slice_memory,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClusterFigures:
    """One reading of a home's ledger for the metrics: per node (arrays of length N, in ``nodes``' order)
    and for the cluster."""

    nodes: Sequence[str]
    models: Sequence[str]
    gpus: np.ndarray
    gpu_memory_bytes: np.ndarray
    allocated_milli: np.ndarray
    allocated_memory_bytes: np.ndarray
    unallocated_milli: np.ndarray
    fragmented_milli: np.ndarray  # float: FGD's measure, milli-GPU
    pending: Mapping[str, tuple[int, float]] = field(default_factory=dict)  # reason -> (pods, longest wait s)
    preemptions: int = 0

    @property
    def capacity_milli(self) -> np.ndarray:
        return self.gpus * MILLI_PER_GPU

    def ratio(self, milli: np.ndarray) -> np.ndarray:
        """``milli`` per node as a share of the node's GPU capacity; 0 on a node without GPUs."""
        capacity = self.capacity_milli
        return np.divide(milli, capacity, out=np.zeros(len(capacity)), where=capacity > 0)

    def cluster_ratio(self, milli: np.ndarray) -> float:
        """``milli`` summed over the nodes as a share of the cluster's GPU capacity; 0 without GPUs."""
        capacity = int(self.capacity_milli.sum())
        return float(milli.sum()) / capacity if capacity else 0.0


def ledger_figures(
    ledger: Ledger,
    nodes: int,
    models: Sequence[str],
    placements: Sequence[Placement],
    open_gpus: np.ndarray,
    target: TargetWorkload,
    *,
    mig_gpus: np.ndarray | None = None,
    free_gpu_milli: np.ndarray | None = None,
    pending: Mapping[str, tuple[int, float]] | None = None,
    preemptions: int = 0,
) -> tuple[ClusterFigures, GpuTally]:
    """The figures of the first ``nodes`` rows of ``ledger`` (``models``: theirs), and the tally they
    come from: ``tally_gpus(placements, …, open_gpus, mig_gpus)`` and FGD's measure against ``target``
    of ``free_gpu_milli`` (default: the ledger's own column; a home that reads its ledger while others
    change it passes a copy taken with its placements)."""
    view = ledger.view
    free = view.free_gpu_milli if free_gpu_milli is None else free_gpu_milli
    tally = tally_gpus(placements, view.gpu_memory_capacity_bytes, open_gpus, mig_gpus)
    fragmented = FragmentationMeasure(target, view.models)(free, view.free_cpu_milli, view.node_model)
    figures = ClusterFigures(
        nodes=view.node_names[:nodes],
        models=models,
        gpus=view.gpu_count[:nodes].copy(),
        gpu_memory_bytes=view.gpu_memory_capacity_bytes[:nodes].sum(axis=1),
        allocated_milli=tally.allocated_milli[:nodes].sum(axis=1),
        allocated_memory_bytes=tally.allocated_memory_bytes[:nodes].sum(axis=1),
        unallocated_milli=tally.unallocated_milli[:nodes].sum(axis=1),
        fragmented_milli=fragmented[:nodes],
        pending=pending or {},
        preemptions=preemptions,
    )
    return figures, tally


def pending_by_reason(waiting: Iterable[tuple[str, float]], now: float) -> dict[str, tuple[int, float]]:
    """(reason code, since) per pending pod -> reason -> (pods, longest wait in seconds)."""
    out: dict[str, tuple[int, float]] = {}
    for reason, since in waiting:
        pods, longest = out.get(reason, (0, 0.0))
        out[reason] = (pods + 1, max(longest, now - since))
    return out


class ClusterCollector(Collector):
    """The families of the module doc from ``figures()``, called at every scrape. None: the home cannot
    read its ledger now, and the scrape shows none of these families rather than an error (the home's
    other metrics still come)."""

    def __init__(self, figures: Callable[[], ClusterFigures | None]) -> None:
        self._figures = figures

    def describe(self) -> Iterator[Metric]:
        return iter(())  # built at collect time; registering must not read the ledger

    def collect(self) -> Iterator[Metric]:
        f = self._figures()
        if f is None:
            return
        yield from _node_families(f)
        pods = GaugeMetricFamily(
            "gpuslice_cluster_pending_pods", "pods waiting for GPUs that gpuslice refused, by reason code",
            labels=["reason"],
        )  # fmt: skip
        wait = GaugeMetricFamily(
            "gpuslice_cluster_pending_longest_wait_seconds",
            "how long the longest-waiting pod of a reason has waited since it was first refused",
            labels=["reason"],
        )
        for reason in PENDING_REASONS:
            count, longest = f.pending.get(reason, (0, 0.0))
            pods.add_metric([reason], count)
            if count:
                wait.add_metric([reason], longest)
        yield from (pods, wait)
        yield CounterMetricFamily(
            "gpuslice_cluster_preemptions", "pods gpuslice preempted to make room", value=f.preemptions
        )


def _per_node(name: str, doc: str, f: ClusterFigures, values: np.ndarray) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["node"])
    # the samples as add_metric makes them, without its per-call zip: 1,000 nodes make 6,000
    family.samples = [Sample(name, {"node": n}, v) for n, v in zip(f.nodes, values.tolist(), strict=True)]
    return family


def _node_families(f: ClusterFigures) -> Iterator[Metric]:
    gpus = GaugeMetricFamily(
        "gpuslice_cluster_node_gpus", "GPUs the node advertises", labels=["node", "model"]
    )
    for node, model, count in zip(f.nodes, f.models, f.gpus.tolist(), strict=True):
        gpus.add_metric([node, model], count)
    yield gpus
    yield _per_node(
        "gpuslice_cluster_node_gpus_allocated", "GPUs given to pods, fractional (milli-GPU / 1000)", f,
        f.allocated_milli / MILLI_PER_GPU,
    )  # fmt: skip
    yield _per_node("gpuslice_cluster_node_gpu_memory_bytes", "GPU memory in total", f, f.gpu_memory_bytes)
    yield _per_node(
        "gpuslice_cluster_node_gpu_memory_allocated_bytes", "GPU memory given to pods", f,
        f.allocated_memory_bytes,
    )  # fmt: skip
    yield _per_node(
        "gpuslice_cluster_node_gpu_unallocated_ratio",
        "GPU capacity pods may still get, 0-1 of the node's GPUs", f, f.ratio(f.unallocated_milli),
    )  # fmt: skip
    yield _per_node(
        "gpuslice_cluster_node_gpu_fragmentation_ratio",
        "FGD's fragmented GPU capacity against the target workload, 0-1 of the node's GPUs", f,
        f.ratio(f.fragmented_milli),
    )  # fmt: skip
