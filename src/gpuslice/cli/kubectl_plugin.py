"""``kubectl gpuslice``: the cluster's GPU slices as gpuslice holds them, read through the API server.

kubectl runs any ``kubectl-NAME`` on PATH for ``kubectl NAME …`` with the rest of the arguments; this is
the ``kubectl-gpuslice`` console script. It reads as kubectl does (``--kubeconfig``, $KUBECONFIG,
``--context``, ``-n``, ``-A``) and writes nothing.

```text
top          cli ─► ClusterReads.nodes, .pods(all) ─► slice_report.cluster_report ─► GPU and slice tables
pods         cli ─► ClusterReads.pods(ns | all), .nodes ─► slice_report.pod_reports ─► pod table
why POD      cli ─► ClusterReads.pod, .events ─► pending_reason.pod_story ─► refusals, newest first
usage        the device plugin pods' /metrics through the API server's pod proxy, read twice
             ``--interval`` apart (k8s.usage); "-" and one dim note where it cannot be read
```

Every error is one ``error: …`` line on stderr and exit 1, as kubectl's own (not gpuslice's 2 for a
user's mistake): no kubeconfig, an API server that does not answer, a refused verb (named), a pod that
does not exist, and gpuslice not installed, which is judged by its one visible mark: no node carries
the inventory annotation its device plugin publishes on each GPU node (gpuslice has no CRD, and the
chart may be installed in any namespace, so a namespace says nothing).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from itertools import groupby
from typing import Annotated, Any

import typer
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from gpuslice.cli import terminal
from gpuslice.cli.options import KubeconfigOption
from gpuslice.errors import Forbidden, GpusliceError, NotFound, Unavailable, UserError
from gpuslice.k8s.annotations import ANNOTATION_NODE_INVENTORY, asks_for_gpuslice
from gpuslice.k8s.cluster_reads import ClusterReads
from gpuslice.k8s.kube_client import ApiError, kubectl_api_client
from gpuslice.k8s.pending_reason import PodStory, extender_scheduler, pod_story
from gpuslice.k8s.slice_report import (
    ClusterReport,
    GpuReport,
    GpuSlice,
    PodReport,
    cluster_report,
    inventory_nodes,
    pod_reports,
)
from gpuslice.k8s.usage import GpuUsage, PodGpuSample, UsageKey, parse_usage, usage_between
from gpuslice.units import format_size

__all__ = ["DEVICE_PLUGIN_LABEL", "app", "main"]

# The device plugin DaemonSet's pod label (deploy/kubernetes/40-device-plugin.yaml and the chart's
# templates/device-plugin.yaml), and the name of its metrics port there.
DEVICE_PLUGIN_LABEL = ("app", "gpuslice-device-plugin")
METRICS_PORT_NAME = "metrics"
NOT_INSTALLED = (
    f"gpuslice is not installed in this cluster: no node carries the {ANNOTATION_NODE_INVENTORY} annotation "
    "(gpuslice's device plugin publishes it on each GPU node it runs on); install gpuslice and label the "
    "GPU nodes gpuslice.io/gpu-node=true (docs/kubernetes.md)"
)

_out = terminal.console(highlight=False)
_err = terminal.console(stderr=True, highlight=False)

app = typer.Typer(
    name="kubectl-gpuslice",
    help="gpuslice's GPU slices in this cluster: what each GPU holds, each pod's slice, why a pod waits.",
    no_args_is_help=True,
    add_completion=False,  # kubectl completes its plugins itself (kubectl_complete-NAME), not typer
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Output(StrEnum):
    table = "table"
    json = "json"


ContextOption = Annotated[str | None, typer.Option("--context", help="the kubeconfig context to use")]
NamespaceOption = Annotated[
    str | None, typer.Option("--namespace", "-n", help="the namespace; default: the context's, else default")
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


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


@contextmanager
def _connect(kubeconfig: Any, context: str | None) -> Iterator[tuple[ClusterReads, str]]:
    api_client, namespace = kubectl_api_client(str(kubeconfig) if kubeconfig else None, context)
    with ClusterReads(api_client) as reads:
        yield reads, namespace


# ---- top ------------------------------------------------------------------------------------------------


@app.command()
def top(
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    interval: IntervalOption = 1.0,
    output: OutputOption = Output.table,
) -> None:
    """Every gpuslice GPU node's GPUs: the slices held on each, memory and compute allocated and free, and
    what the pods use (from the device plugins' metrics, when they can be read).

    Example: kubectl gpuslice top
    """
    with _connect(kubeconfig, context) as (reads, _):
        nodes = reads.nodes()
        if not inventory_nodes(nodes):
            raise UserError(NOT_INSTALLED)
        pods = reads.pods(None)
        usage, notes = _usage(reads, pods, {_name(n) for n in inventory_nodes(nodes)}, interval)
    report = cluster_report(nodes, pods, usage)
    notes = [*report.unreadable, *_conflict_note(report), *notes]
    if output is Output.json:
        _print_json({"gpus": [_gpu_json(g) for g in report.gpus], "notes": notes})
        return
    for node, on_node in groupby(report.gpus, key=lambda g: g.node):  # the report is in node order
        gpus = list(on_node)
        models = Counter(g.model for g in gpus)
        _out.print(_text(f"{node}: " + ", ".join(f"{n} × {m}" for m, n in models.items()), style="bold"))
        _out.print(_gpu_table(gpus))
        slices = [(g, s) for g in gpus for s in g.slices]
        if slices:
            _out.print(_slice_table(slices, usage.get(node)))
        _out.print()
    _print_notes(notes)


# A node's name heads its own section: cloud node names run to 40 characters and more
# (ip-10-0-113-207.eu-west-1.compute.internal), which no 80-column table row has room for.


def _gpu_table(gpus: Sequence[GpuReport]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("GPU")
    for header in ("MEMORY", "MEM ALLOC", "MEM FREE", "CORE ALLOC", "USED", "BUSY"):
        table.add_column(header, justify="right")
    for gpu in gpus:
        mode = " MIG" if gpu.mig else ""
        table.add_row(
            _text(
                f"{gpu.index}{mode}" + ("" if gpu.healthy else " UNHEALTHY"),
                "" if gpu.healthy else "bold red",
            ),
            format_size(gpu.memory_bytes),
            format_size(gpu.allocated_memory_bytes),
            format_size(gpu.free_memory_bytes),
            f"{gpu.allocated_compute_percent:.0f} %",
            *_usage_cells(gpu.usage),
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
        if usage is not None and used is None:
            used = GpuUsage(0, 0.0)  # its plugin answered and has no series for it: it uses nothing
        table.add_row(f"{held.namespace}/{held.pod}", str(gpu.index), held.text(), *_usage_cells(used))
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
        **_usage_json(gpu.usage),
        "slices": [_slice_json(s) for s in gpu.slices],
    }


def _slice_json(held: GpuSlice) -> dict[str, Any]:
    return {
        "namespace": held.namespace,
        "pod": held.pod,
        "kind": held.kind,
        "memoryBytes": held.memory_bytes,
        "computePercent": round(held.compute_percent, 2),
        "migProfile": held.mig_profile or None,
    }


def _conflict_note(report: ClusterReport) -> list[str]:
    if not report.conflicts:
        return []
    return [
        f"{report.conflicts} slice(s) of bound pods do not fit the ledger (placed from outside gpuslice, or "
        "on GPUs the inventory no longer has): the extender counts them as conflicts too"
    ]


# ---- pods -----------------------------------------------------------------------------------------------


@app.command()
def pods(
    kubeconfig: KubeconfigOption = None,
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
    with _connect(kubeconfig, context) as (reads, default_namespace):
        scope = None if all_namespaces else (namespace or default_namespace)
        listed = reads.pods(scope)
        notes: list[str] = []
        nodes: list[dict[str, Any]] | None = None
        try:
            nodes = reads.nodes()
        except Forbidden as err:  # a namespace's user often may not list nodes: no ledger, decisions only
            notes.append(f"slices from the pods' decisions only ({err})")
        if nodes is not None and not inventory_nodes(nodes):
            raise UserError(NOT_INSTALLED)
        bound_to = {str((p.get("spec") or {}).get("nodeName") or "") for p in listed if asks_for_gpuslice(p)}
        usage, usage_notes = _usage(reads, None, bound_to - {""}, interval)
    found = pod_reports(listed, nodes, usage)
    notes += usage_notes
    if output is Output.json:
        _print_json({"pods": [_pod_json(p) for p in found], "notes": notes})
        return
    if not found:
        where = "any namespace" if scope is None else f"namespace {scope}"
        _out.print(f"No pod in {terminal.shown(where)} asks for gpuslice GPUs.")
    else:
        _out.print(_pod_table(found, every_namespace=scope is None))
    _print_notes(notes + [f"{p.namespace}/{p.name}: {p.problem}" for p in found if p.problem])


def _pod_table(found: Sequence[PodReport], every_namespace: bool) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    if every_namespace:
        table.add_column("NAMESPACE")
    table.add_column("POD")
    table.add_column("STATUS")
    table.add_column("SLICE")
    table.add_column("GPU")
    table.add_column("NODE")
    table.add_column("USED", justify="right")
    table.add_column("BUSY", justify="right")
    for pod in found:
        cells = [pod.namespace] if every_namespace else []
        table.add_row(
            *cells,
            pod.name,
            pod.phase,
            pod.asks or "?",
            ",".join(str(g) for g in pod.gpus) or "-",
            pod.node or "-",
            *_usage_cells(pod.usage),
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
        "slices": [{"gpu": gpu, **_slice_json(held)} for gpu, held in pod.slices],
        **_usage_json(pod.usage),
        "problem": pod.problem or None,
    }


# ---- why ------------------------------------------------------------------------------------------------


@app.command()
def why(
    pod: Annotated[str, typer.Argument(help="the pod's name")],
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Why a pod waits: the scheduler's refusals with their amounts, newest first, from its
    FailedScheduling events; or where it runs and with which slice, or that it asks for no GPU.

    Example: kubectl gpuslice why train-7 -n team-a
    """
    with _connect(kubeconfig, context) as (reads, default_namespace):
        scope = namespace or default_namespace
        try:
            found = reads.pod(scope, pod)
        except NotFound:
            raise NotFound(f"pod {pod} not found in namespace {scope}") from None
        events = reads.events(scope, pod) if _pending(found) else []
    story = pod_story(found, events)
    if output is Output.json:
        _print_json(_story_json(story))
        return
    for line in _story_lines(story):
        _out.print(line, soft_wrap=False)


def _pending(pod: Mapping[str, Any]) -> bool:
    return not (pod.get("spec") or {}).get("nodeName")


def _story_lines(story: PodStory) -> list[Text | Padding]:
    who = f"pod {story.namespace}/{story.name}"
    if story.state == "no-gpu":
        return [_text(f"{who} does not ask for a GPU: no container names a gpuslice.io resource.")]
    if story.state == "unreadable":
        return [_text(f"{who}: its gpuslice ask or decision cannot be read: {story.problem}")]
    if story.state == "ended":
        return [_text(f"{who} has ended ({story.phase}); it asked for {story.asks}.")]
    if story.state == "bound":
        held = "; ".join(story.slices) or "no gpuslice slice"
        bound: list[Text | Padding] = [
            _text(f"{who} is not pending: bound to node {story.node} with {held} ({story.phase}).")
        ]
        return bound + ([_text(story.problem, style="yellow")] if story.problem else [])
    lines: list[Text | Padding] = [_text(f"{who} is pending; it asks for {story.asks}.")]
    if not story.events:
        lines.append(_text("No FailedScheduling event about it (events are kept for an hour)."))
    for event in story.events:
        seen = _age(event.last_seen.timestamp()) if event.last_seen else "at an unknown time"
        times = f", {event.count} times" if event.count > 1 else ""
        lines.append(
            _text(f"{event.reason} from {event.source or 'an unnamed source'}, {seen}{times}:", style="bold")
        )
        lines.append(Padding(_text(event.message), (0, 0, 0, 2)))  # wrapped lines indented too
    if story.condition and not story.events:
        lines.append(_text(f"Its PodScheduled condition: {story.condition}"))
    if not extender_scheduler(story) and not any(e.source == "gpuslice-extender" for e in story.events):
        lines.append(
            _text(
                f"Its scheduler is {story.scheduler}, not gpuslice's: the gpuslice extender is not asked "
                "about it (gpuslice's admission webhook sets it on pods that ask for gpuslice.io resources).",
                style="yellow",
            )
        )
    return lines


def _age(timestamp: float) -> str:
    seconds = max(0, int(time.time() - timestamp))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _story_json(story: PodStory) -> dict[str, Any]:
    return {
        "namespace": story.namespace,
        "name": story.name,
        "state": story.state,
        "phase": story.phase,
        "asks": story.asks or None,
        "node": story.node or None,
        "slices": list(story.slices),
        "scheduler": story.scheduler,
        "condition": story.condition or None,
        "events": [
            {
                "reason": e.reason,
                "source": e.source,
                "message": e.message,
                "count": e.count,
                "lastSeen": e.last_seen.isoformat() if e.last_seen else None,
            }
            for e in story.events
        ],
        "problem": story.problem or None,
    }


# ---- usage: the device plugins' metrics -----------------------------------------------------------------


@dataclass(frozen=True)
class _Plugin:
    node: str
    namespace: str
    pod: str
    port: int


def _plugins(pods: Sequence[Mapping[str, Any]]) -> dict[str, _Plugin]:
    """node -> its running device plugin pod with a metrics port (the newest, while a roll runs two)."""
    key, value = DEVICE_PLUGIN_LABEL
    found: dict[str, tuple[str, _Plugin]] = {}
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (meta.get("labels") or {}).get(key) != value or (pod.get("status") or {}).get(
            "phase"
        ) != "Running":
            continue
        ports = [
            p
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if isinstance(p, dict)
            and p.get("name") == METRICS_PORT_NAME
            and isinstance(p.get("containerPort"), int)
        ]
        node = str(spec.get("nodeName") or "")
        created = str(meta.get("creationTimestamp") or "")
        if ports and node and created >= found.get(node, ("", None))[0]:
            plugin = _Plugin(
                node, str(meta.get("namespace", "")), str(meta.get("name", "")), ports[0]["containerPort"]
            )
            found[node] = (created, plugin)
    return {node: plugin for node, (_, plugin) in found.items()}


def _usage(
    reads: ClusterReads, pods: Sequence[Mapping[str, Any]] | None, nodes: set[str], interval_s: float
) -> tuple[dict[str, dict[UsageKey, GpuUsage]], list[str]]:
    """Per node of ``nodes`` whose device plugin's metrics could be read, its pods' use; and one note
    per reason it could not be read elsewhere. ``pods``: every pod, if already listed."""
    if not nodes:
        return {}, []
    try:
        plugins = _plugins(
            pods if pods is not None else reads.pods(None, label="=".join(DEVICE_PLUGIN_LABEL))
        )
    except Forbidden as err:
        return {}, [f"usage not shown: {err}"]
    missing = sorted(n for n in nodes if n not in plugins)
    failed: dict[str, list[str]] = {}
    if missing:
        failed["no running gpuslice device plugin with a metrics port"] = missing
    first = _read_all(reads, [plugins[n] for n in sorted(nodes) if n in plugins], failed)
    second = first
    if interval_s > 0 and first:
        time.sleep(interval_s)
        second = _read_all(reads, [plugins[n] for n in first], failed)
    usage = {}
    for node, (page, read_at) in second.items():
        before, before_at = first[node]
        usage[node] = usage_between(before, page, read_at - before_at)
    notes = [f"usage not shown for {', '.join(sorted(set(where)))}: {why}" for why, where in failed.items()]
    return usage, notes


def _read_all(
    reads: ClusterReads, plugins: Sequence[_Plugin], failed: dict[str, list[str]]
) -> dict[str, tuple[dict[UsageKey, PodGpuSample], float]]:
    """node -> its plugin's page and when it was read (the middle of the request: the busy counters
    are taken then, give or take the request's own time)."""
    out = {}
    for plugin in plugins:
        asked = time.monotonic()
        try:
            page = parse_usage(reads.metrics(plugin.namespace, plugin.pod, plugin.port))
        except (GpusliceError, ValueError) as err:
            reason = str(err) if isinstance(err, Forbidden | Unavailable) else _plugin_failure(plugin, err)
            failed.setdefault(reason, []).append(plugin.node)
            continue
        if page is None:
            failed.setdefault("its device plugin exports no per-pod usage (an older gpuslice)", []).append(
                plugin.node
            )
            continue
        out[plugin.node] = (page, (asked + time.monotonic()) / 2)
    return out


def _plugin_failure(plugin: _Plugin, err: Exception) -> str:
    if isinstance(err, ValueError):
        return "its device plugin's /metrics is not Prometheus text"
    if isinstance(err, ApiError):
        return f"its device plugin's /metrics did not answer through the pod proxy ({err})"
    return str(err)


def _usage_cells(usage: GpuUsage | None) -> tuple[str, str]:
    if usage is None:
        return "-", "-"
    used = "-" if usage.memory_used_bytes is None else format_size(usage.memory_used_bytes)
    busy = "-" if usage.busy_percent is None else f"{usage.busy_percent:.0f} %"
    return used, busy


def _usage_json(usage: GpuUsage | None) -> dict[str, Any]:
    return {
        "usedMemoryBytes": None if usage is None else usage.memory_used_bytes,
        "busyPercent": None if usage is None or usage.busy_percent is None else round(usage.busy_percent, 2),
    }


# ---- output and errors ----------------------------------------------------------------------------------


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def _print_notes(notes: Sequence[str]) -> None:
    for note in notes:
        _out.print(_text(f"note: {note}", style="dim"))


def _text(text: str, style: str = "") -> Text:
    """A line of what the cluster says (event messages, annotations anyone with write access set) with
    its control characters written out: a ``Text`` is not passed through ``render_str`` as a str is."""
    return Text(terminal.visible(text), style=style)


def _error_line(text: str) -> None:
    _err.print(f"error: {text}", markup=False, highlight=False, soft_wrap=True)


def main(args: list[str] | None = None) -> None:
    """The ``kubectl-gpuslice`` console script: every error is one line on stderr and exit 1."""
    from gpuslice.cli.main import build_command

    # The extender's cache logs what it leaves out (a malformed decision, a slice that does not fit);
    # here the report says it as notes, and a log line would only repeat it on stderr.
    logging.getLogger("gpuslice").addHandler(logging.NullHandler())
    # A kubeconfig with insecure-skip-tls-verify asked for it: kubectl does not warn on every request.
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    try:
        result = build_command(app).main(args=args, prog_name="kubectl gpuslice", standalone_mode=False)
    except GpusliceError as err:
        _error_line(str(err))
        raise SystemExit(1) from None
    except typer.TyperException as err:  # the option parser's: a missing argument, an unknown option
        if type(err).__name__ == "NoArgsIsHelpError":
            typer.echo(err.format_message())
            raise SystemExit(0) from None
        ctx = getattr(err, "ctx", None)
        where = ctx.command_path if ctx is not None else "kubectl gpuslice"
        _error_line(f"{err.format_message().rstrip('.')} (see `{where} --help`)")
        raise SystemExit(1) from None
    except typer.Abort:
        _error_line("aborted")
        raise SystemExit(130) from None
    raise SystemExit(result if isinstance(result, int) else 0)
