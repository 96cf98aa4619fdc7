"""What ``gpuslice k8s device-plugin`` runs: the plugin wired to the API server, NVML health, metrics."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import MigLayout
from gpuslice.k8s.annotations import (
    ANNOTATION_NODE_INVENTORY,
    DEFAULT_SPLIT_COUNT,
    DEFAULT_STATE_DIR,
)
from gpuslice.k8s.device_plugin.devices import (
    default_mig_layouts,
    mig_health_keys,
    node_labels,
    nvml_mig_layouts,
)
from gpuslice.k8s.device_plugin.kube import NodeKubeClient, NodePublisher, PodSource
from gpuslice.k8s.device_plugin.plugin import DEVICE_PLUGIN_PATH, DevicePlugin
from gpuslice.k8s.device_plugin.record import ALLOCATION_RECORD
from gpuslice.k8s.node_metrics import device_plugin_collector
from gpuslice.k8s.uninstall import clear_state_folder, daemonset_gone
from gpuslice.node.enforcement import SharingMode
from gpuslice.node.gpu_faults import (
    FakeHealthSource,
    HealthSource,
    NoHealthChecks,
    NvmlHealthSource,
)
from gpuslice.observe.k8s_metrics import DevicePluginMetrics
from gpuslice.observe.metrics_server import serve_metrics

__all__ = [
    "serve",
]

log = logging.getLogger(__name__)


def serve(
    machine: Machine,
    node_name: str,
    *,
    simulated: bool,
    pods: PodSource | None = None,
    node: NodePublisher | None = None,
    kubeconfig: str | None = None,
    split_count: int = DEFAULT_SPLIT_COUNT,
    socket_dir: str | os.PathLike[str] = DEVICE_PLUGIN_PATH,
    sharing: SharingMode | str = SharingMode.SOFT,
    state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR,
    mig_layouts: Mapping[int, MigLayout] | None = None,
    health_checks: bool = True,
    stop: threading.Event | None = None,
    on_ready: Callable[[DevicePlugin], None] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "0.0.0.0",
    daemonset: tuple[str, str] | None = None,
    instance: str = "",
) -> None:
    """Run the device plugin for ``machine`` until ``stop`` is set (default: until SIGTERM or SIGINT).

    A simulated machine (``discover(simulate=…)``) gets its MIG layouts from ``default_mig_layouts``,
    no NVML health checks; a real one reads its MIG layouts and XID events through NVML. Without
    ``pods``, ``NodeKubeClient(kubeconfig)`` serves as
    both the pod source and the node publisher. With ``metrics_port``, Prometheus metrics (device and
    GPU health, observe/k8s_metrics.py; each slice's use, observe/node_slices.py) are served at
    ``http://metrics_host:metrics_port/metrics``.
    With ``daemonset`` (namespace, name: the DaemonSet this runs in), a stop while it is gone or being
    deleted takes back what the plugin wrote on the node (``k8s.uninstall``)."""
    if mig_layouts is None:
        mig_layouts = default_mig_layouts(machine) if simulated else nvml_mig_layouts(machine)
    owned: NodeKubeClient | None = None
    if pods is None:
        pods = node = owned = NodeKubeClient(kubeconfig)
    health: HealthSource
    if simulated:
        health = FakeHealthSource()  # nothing breaks on a simulated node
    elif health_checks:
        health = NvmlHealthSource(machine, mig_devices=mig_health_keys(machine, mig_layouts))
    else:
        health = NoHealthChecks()
    plugin = DevicePlugin(
        machine,
        node_name,
        pods=pods,
        node=node,
        health=health,
        split_count=split_count,
        socket_dir=socket_dir,
        mig_layouts=mig_layouts,
        sharing=sharing,
        state_dir=state_dir,
        instance=instance,
    )
    done = stop if stop is not None else threading.Event()
    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
    stop_metrics = None
    try:
        plugin.start()
        if metrics_port is not None:
            registry = DevicePluginMetrics(plugin.device_health, plugin.gpu_health).registry
            registry.register(device_plugin_collector(plugin, pods, simulated=simulated))
            stop_metrics = serve_metrics(registry, metrics_port, metrics_host)
        if on_ready is not None:
            on_ready(plugin)
        while not done.wait(1.0):
            pass
    finally:
        if stop_metrics is not None:
            stop_metrics()
        plugin.stop()
        if owned is not None:
            if daemonset is not None and daemonset_gone(owned.api_client, *daemonset):
                _forget_node(owned, node_name, machine, Path(state_dir))
            owned.close()


def _forget_node(node: NodeKubeClient, node_name: str, machine: Machine, state_dir: Path) -> None:
    try:
        kept = forget_node(node.core, node_name, machine, state_dir, node.slice_holders(node_name))
    except Exception as err:  # the API server away: the next install overwrites what is left
        log.error("gpuslice is being removed, but node %s could not be cleared: %s", node_name, err)
        return
    log.info(
        "gpuslice is being removed: node %s cleared%s", node_name, f"; kept {'; '.join(kept)}" if kept else ""
    )


def forget_node(
    core: Any, node_name: str, machine: Machine, state_dir: Path, holders: Sequence[str]
) -> list[str]:
    """Take back what the device plugin wrote on ``node_name``: its inventory annotation and feature
    labels, and (when no pod in ``holders`` still holds a slice there) its state folders, then the
    state folder itself if that leaves it empty (in a pod, the folder is the hostPath volume's mount point
    and stays, empty). What was left, in words (for the log)."""
    labels = dict.fromkeys(node_labels(machine))  # None: a merge patch deletes the key
    core.patch_node(
        node_name, {"metadata": {"annotations": {ANNOTATION_NODE_INVENTORY: None}, "labels": labels}}
    )
    if holders:
        return [f"{state_dir}: {len(holders)} pod(s) still hold slices here ({', '.join(holders[:5])})"]
    return clear_state_folder(state_dir, (ALLOCATION_RECORD,))
