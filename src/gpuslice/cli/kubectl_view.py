"""What the ``kubectl gpuslice`` commands share: kubectl's options, the connection, and how they print
(tables on the CLI's console, ``-o json`` with stable camelCase keys, dim notes, cluster text made
visible)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.text import Text

from gpuslice.cli import terminal
from gpuslice.cli.options import object_name
from gpuslice.k8s.cluster_reads import ClusterReads
from gpuslice.k8s.kube_client import kubectl_api_client
from gpuslice.k8s.slice_report import GpuSlice
from gpuslice.k8s.usage import GpuUsage
from gpuslice.units import format_size

__all__ = [
    "AllNamespacesOption",
    "ContextOption",
    "IntervalOption",
    "NamespaceOption",
    "Output",
    "OutputOption",
    "connect",
    "out",
    "pod_name",
    "print_json",
    "print_notes",
    "slice_json",
    "text",
    "usage_cells",
    "usage_json",
]

out = terminal.console(highlight=False)


class Output(StrEnum):
    table = "table"
    json = "json"


ContextOption = Annotated[str | None, typer.Option("--context", help="the kubeconfig context to use")]


def _namespace(value: str | None) -> str | None:
    """A namespace must be an object name: another would only come back as a 404 or a 400 with the API
    server's words (or, with a '/', as a path to something else)."""
    return None if value is None else object_name(value, "namespace")


def pod_name(value: str) -> str:
    return object_name(value, "pod name")


NamespaceOption = Annotated[
    str | None,
    typer.Option(
        "--namespace", "-n", callback=_namespace, help="the namespace; default: the context's, else default"
    ),
]
AllNamespacesOption = Annotated[
    bool, typer.Option("--all-namespaces", "-A", help="every namespace (the namespace is ignored)")
]
OutputOption = Annotated[
    Output, typer.Option("--output", "-o", help="table, or json for scripts (stable keys)")
]
IntervalOption = Annotated[
    float,
    typer.Option(
        min=0.0,
        max=60.0,
        help="seconds between the two reads of the device plugins' metrics that give compute busy; 0: one "
        "read, memory used only",
    ),
]


@contextmanager
def connect(kubeconfig: Any, context: str | None) -> Iterator[tuple[ClusterReads, str]]:
    """The reads and the namespace of the context, found as kubectl finds them; closed after."""
    api_client, namespace = kubectl_api_client(str(kubeconfig) if kubeconfig else None, context)
    with ClusterReads(api_client) as reads:
        yield reads, namespace


def text(line: str, style: str = "") -> Text:
    """A line of what the cluster says (event messages, annotations anyone with write access set) with
    its control characters written out: a ``Text`` is not passed through ``render_str`` as a str is."""
    return Text(terminal.visible(line), style=style)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def print_notes(notes: Sequence[str]) -> None:
    for note in notes:
        out.print(text(f"note: {note}", style="dim"))


def usage_cells(usage: GpuUsage | None) -> tuple[str, str]:
    """USED and BUSY; "-" where unknown (no metrics read, or no usage series for the slice)."""
    if usage is None:
        return "-", "-"
    used = "-" if usage.memory_used_bytes is None else format_size(usage.memory_used_bytes)
    busy = "-" if usage.busy_percent is None else f"{usage.busy_percent:.0f} %"
    return used, busy


def usage_json(usage: GpuUsage | None) -> dict[str, Any]:
    return {
        "usedMemoryBytes": None if usage is None else usage.memory_used_bytes,
        "busyPercent": None if usage is None or usage.busy_percent is None else round(usage.busy_percent, 2),
    }


def slice_json(held: GpuSlice) -> dict[str, Any]:
    return {
        "namespace": held.namespace,
        "pod": held.pod,
        "kind": held.kind,
        "memoryBytes": held.memory_bytes,
        "computePercent": round(held.compute_percent, 2),
        "migProfile": held.mig_profile or None,
    }
