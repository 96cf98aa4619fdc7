"""``kubectl gpuslice pods``: the pods that ask for gpuslice GPUs, each with its slice, GPUs, node and
use; the namespace's, or every namespace's with ``-A``.

A namespace's user often may not list nodes: the pods and their decisions still show, without the
ledger (a note says so), and gpuslice's installation is then not judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.cli.kubectl_view import (
    AllNamespacesOption,
    ContextOption,
    IntervalOption,
    NamespaceOption,
    Output,
    OutputOption,
    connect,
    out,
    print_json,
    print_notes,
    slice_json,
    usage_cells,
    usage_json,
)
from gpuslice.cli.options import KubectlKubeconfigOption
from gpuslice.errors import Forbidden
from gpuslice.k8s.annotations import asks_for_gpuslice
from gpuslice.k8s.plugin_usage import read_usage
from gpuslice.k8s.slice_report import PodReport, pod_reports, require_installed

__all__ = ["pods"]


def pods(
    kubeconfig: KubectlKubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    all_namespaces: AllNamespacesOption = False,
    interval: IntervalOption = 1.0,
    output: OutputOption = Output.table,
) -> None:
    """The pods that ask for gpuslice GPUs: each one's slice, GPU(s), node and use; the namespace's by
    default, every namespace's with -A.

    Example: kubectl gpuslice pods -n team-a
    """
    notes: list[str] = []
    nodes: list[dict[str, Any]] | None = None
    with connect(kubeconfig, context) as (reads, default_namespace):
        scope = None if all_namespaces else (namespace or default_namespace)
        listed = reads.pods(scope)
        try:
            nodes = reads.nodes()
        except Forbidden as err:
            notes.append(f"slices from the pods' decisions only ({err})")
        if nodes is not None:
            require_installed(nodes)
        bound_to = {str((p.get("spec") or {}).get("nodeName") or "") for p in listed if asks_for_gpuslice(p)}
        usage, usage_notes = read_usage(reads, None, bound_to - {""}, interval)
    found = pod_reports(listed, nodes, usage)
    notes += usage_notes + [f"{p.namespace}/{p.name}: {p.problem}" for p in found if p.problem]
    if output is Output.json:
        print_json({"pods": [_pod_json(p) for p in found], "notes": notes})
        return
    if not found:
        where = "any namespace" if scope is None else f"namespace {scope}"
        out.print(f"No pod in {terminal.shown(where)} asks for gpuslice GPUs.")
    else:
        out.print(_pod_table(found, every_namespace=scope is None))
    print_notes(notes)


def _pod_table(found: Sequence[PodReport], every_namespace: bool) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    headers = ["NAMESPACE"] if every_namespace else []
    for header in (*headers, "POD", "STATUS", "SLICE", "GPU", "NODE"):
        table.add_column(header)
    table.add_column("USED", justify="right")
    table.add_column("BUSY", justify="right")
    for pod in found:
        cells = [pod.namespace] if every_namespace else []
        gpus = ",".join(str(g) for g in pod.gpus) or "-"
        table.add_row(
            *cells, pod.name, pod.phase, pod.asks or "?", gpus, pod.node or "-", *usage_cells(pod.usage)
        )
    return table


def _pod_json(pod: PodReport) -> dict[str, Any]:
    return {
        "namespace": pod.namespace,
        "name": pod.name,
        "phase": pod.phase,
        "asks": pod.asks,
        "node": pod.node or None,
        "gpus": list(pod.gpus),
        "slices": [{"gpu": gpu, **slice_json(held)} for gpu, held in pod.slices],
        **usage_json(pod.usage),
        "problem": pod.problem or None,
    }
