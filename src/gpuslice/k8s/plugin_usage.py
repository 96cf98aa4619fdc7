"""Each node's pod usage, read from its gpuslice device plugin's /metrics through the API server's pod
proxy (``kubectl gpuslice top`` and ``pods``): no port-forward, no Prometheus, only ``get pods/proxy``.

```text
plugin_pods(pods)      node -> its Running device plugin pod with a metrics port (the newest of a roll's two)
read_usage(reads, …)   read each node's page, wait ``interval_s``, read again: memory used at the second
                       read, compute busy between the two (k8s.usage); one note per reason a node's page
                       could not be read (no plugin there, pods/proxy refused, not Prometheus text …)
```
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.errors import Forbidden, GpusliceError, Unavailable
from gpuslice.k8s.cluster_reads import ClusterReads
from gpuslice.k8s.kube_client import ApiError
from gpuslice.k8s.usage import GpuUsage, PodGpuSample, UsageKey, parse_usage, usage_between

__all__ = ["DEVICE_PLUGIN_LABEL", "METRICS_PORT_NAME", "PluginPod", "plugin_pods", "read_usage"]

# The device plugin DaemonSet's pod label (deploy/kubernetes/40-device-plugin.yaml and the chart's
# templates/device-plugin.yaml), and the name of its metrics port there.
DEVICE_PLUGIN_LABEL = ("app", "gpuslice-device-plugin")
METRICS_PORT_NAME = "metrics"
NodeUsage = dict[str, dict[UsageKey, GpuUsage]]


@dataclass(frozen=True, slots=True)
class PluginPod:
    node: str
    namespace: str
    pod: str
    port: int


def plugin_pods(pods: Sequence[Mapping[str, Any]]) -> dict[str, PluginPod]:
    """node -> its running device plugin pod with a metrics port (the newest, while a roll runs two)."""
    key, value = DEVICE_PLUGIN_LABEL
    found: dict[str, tuple[str, PluginPod]] = {}
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        running = (pod.get("status") or {}).get("phase") == "Running"
        if (meta.get("labels") or {}).get(key) != value or not running:
            continue
        ports = [
            p["containerPort"]
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if isinstance(p, dict)
            and p.get("name") == METRICS_PORT_NAME
            and isinstance(p.get("containerPort"), int)
        ]
        node = str(spec.get("nodeName") or "")
        created = str(meta.get("creationTimestamp") or "")
        if ports and node and created >= found.get(node, ("", None))[0]:
            found[node] = (
                created,
                PluginPod(node, str(meta.get("namespace", "")), str(meta.get("name", "")), ports[0]),
            )
    return {node: plugin for node, (_, plugin) in found.items()}


def read_usage(
    reads: ClusterReads, pods: Sequence[Mapping[str, Any]] | None, nodes: set[str], interval_s: float
) -> tuple[NodeUsage, list[str]]:
    """Per node of ``nodes`` whose device plugin's metrics could be read, its pods' use; and one note
    per reason it could not be read elsewhere. ``pods``: every pod of the cluster if already listed,
    else the plugins are listed by their label (in every namespace: the chart may be in any)."""
    if not nodes:
        return {}, []
    try:
        listed = pods if pods is not None else reads.pods(None, label="=".join(DEVICE_PLUGIN_LABEL))
    except Forbidden as err:
        return {}, [f"usage not shown: {err}"]
    plugins = plugin_pods(listed)
    failed: dict[str, list[str]] = {}
    missing = sorted(n for n in nodes if n not in plugins)
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
    reads: ClusterReads, plugins: Sequence[PluginPod], failed: dict[str, list[str]]
) -> dict[str, tuple[dict[UsageKey, PodGpuSample], float]]:
    """node -> its plugin's page and when it was read (the middle of the request: the busy counters
    are taken then, give or take the request's own time)."""
    out = {}
    for plugin in plugins:
        asked = time.monotonic()
        try:
            page = parse_usage(reads.metrics(plugin.namespace, plugin.pod, plugin.port))
        except (GpusliceError, ValueError) as err:
            failed.setdefault(_failure(err), []).append(plugin.node)
            continue
        if page is None:
            failed.setdefault(
                "its device plugin exports no per-pod usage (no shim sharing, or an older gpuslice)", []
            ).append(plugin.node)
            continue
        out[plugin.node] = (page, (asked + time.monotonic()) / 2)
    return out


def _failure(err: Exception) -> str:
    if isinstance(err, Forbidden | Unavailable):
        return str(err)  # "no permission to get pods/proxy of …" / "cannot reach the API server …"
    if isinstance(err, ValueError):
        return "its device plugin's /metrics is not Prometheus text"
    if isinstance(err, ApiError):
        return f"its device plugin's /metrics did not answer through the pod proxy ({err})"
    return str(err)
