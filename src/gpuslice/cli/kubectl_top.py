"""``kubectl gpuslice top``: every gpuslice GPU node's GPUs, what their slices hold and what is free, and
what the pods use.

A node's name heads its own section: cloud node names run to 40 characters and more
(ip-10-0-113-207.eu-west-1.compute.internal), which no 80-column table row has room for beside the
figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any

from rich.table import Table

from gpuslice.cli.kubectl_view import (
    ContextOption,
    IntervalOption,
    Output,
    OutputOption,
    connect,
    out,
    print_json,
    print_notes,
    slice_json,
    text,
    usage_cells,
    usage_json,
)
from gpuslice.cli.options import KubectlKubeconfigOption
from gpuslice.k8s.plugin_usage import read_usage
from gpuslice.k8s.slice_report import (
    ClusterReport,
    GpuReport,
    GpuSlice,
    cluster_report,
    inventory_nodes,
    require_installed,
)
from gpuslice.k8s.usage import GpuUsage, UsageKey
from gpuslice.units import format_size

__all__ = ["top"]


def top(
    kubeconfig: KubectlKubeconfigOption = None,
    context: ContextOption = None,
    interval: IntervalOption = 1.0,
    output: OutputOption = Output.table,
) -> None:
    """Every gpuslice GPU node's GPUs: the slices held on each, memory and compute allocated and free, and
    what the pods use (from the device plugins' metrics, when they can be read).

    Example: kubectl gpuslice top
    """
    with connect(kubeconfig, context) as (reads, _):
        nodes = reads.nodes()
        require_installed(nodes)
        pods = reads.pods(None)
        names = {str((n.get("metadata") or {}).get("name", "")) for n in inventory_nodes(nodes)}
        usage, notes = read_usage(reads, pods, names, interval)
    report = cluster_report(nodes, pods, usage)
    notes = [*report.unreadable, *_conflict_note(report), *notes, *_unmeasured_note(report, usage)]
    if output is Output.json:
        print_json({"gpus": [_gpu_json(g) for g in report.gpus], "notes": notes})
        return
    for node, on_node in groupby(report.gpus, key=lambda g: g.node):  # the report is in node order
        gpus = list(on_node)
        models = Counter(g.model for g in gpus)
        out.print(text(f"{node}: " + ", ".join(f"{n} × {m}" for m, n in models.items()), style="bold"))
        out.print(_gpu_table(gpus))
        slices = [(g, s) for g in gpus for s in g.slices]
        if slices:
            out.print(_slice_table(slices, usage.get(node)))
        out.print()
    print_notes(notes)


def _gpu_table(gpus: Sequence[GpuReport]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("GPU")
    for header in ("MEMORY", "MEM ALLOC", "MEM FREE", "CORE ALLOC", "USED", "BUSY"):
        table.add_column(header, justify="right")
    for gpu in gpus:
        label = f"{gpu.index}" + (" MIG" if gpu.mig else "") + ("" if gpu.healthy else " UNHEALTHY")
        table.add_row(
            text(label, "" if gpu.healthy else "bold red"),
            format_size(gpu.memory_bytes),
            format_size(gpu.allocated_memory_bytes),
            format_size(gpu.free_memory_bytes),
            f"{gpu.allocated_compute_percent:.0f} %",
            *usage_cells(gpu.usage),
        )
    return table


def _slice_table(
    slices: Sequence[tuple[GpuReport, GpuSlice]], usage: Mapping[UsageKey, GpuUsage] | None
) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in ("POD", "GPU", "SLICE"):
        table.add_column(header)
    table.add_column("USED", justify="right")
    table.add_column("BUSY", justify="right")
    for gpu, held in slices:
        used = None if usage is None else usage.get(UsageKey(held.namespace, held.pod, gpu.index))
        table.add_row(f"{held.namespace}/{held.pod}", str(gpu.index), held.text(), *usage_cells(used))
    return table


def _gpu_json(gpu: GpuReport) -> dict[str, Any]:
    return {
        "node": gpu.node,
        "index": gpu.index,
        "model": gpu.model,
        "healthy": gpu.healthy,
        "mig": gpu.mig,
        "memoryBytes": gpu.memory_bytes,
        "allocatedMemoryBytes": gpu.allocated_memory_bytes,
        "freeMemoryBytes": gpu.free_memory_bytes,
        "allocatedComputePercent": round(gpu.allocated_compute_percent, 2),
        "freeComputePercent": round(gpu.free_compute_percent, 2),
        **usage_json(gpu.usage),
        "slices": [slice_json(s) for s in gpu.slices],
    }


def _conflict_note(report: ClusterReport) -> list[str]:
    if not report.conflicts:
        return []
    return [
        f"{report.conflicts} slice(s) of bound pods do not fit the ledger (placed from outside gpuslice, or "
        "on GPUs the inventory no longer has): the extender counts them as conflicts too"
    ]


def _unmeasured_note(report: ClusterReport, usage: Mapping[str, Mapping[UsageKey, GpuUsage]]) -> list[str]:
    """Slices on nodes whose plugin answered but that have no usage series of their own."""
    missing = [
        f"{s.namespace}/{s.pod}"
        for g in report.gpus
        if g.node in usage
        for s in g.slices
        if UsageKey(s.namespace, s.pod, g.index) not in usage[g.node]
    ]
    if not missing:
        return []
    return [
        f"no usage series for {', '.join(sorted(set(missing)))}: their device plugin reads usage from the "
        "shim's regions, which a slice without shim sharing does not have"
    ]
