"""``gpuslice k8s device-plugin``: the kubelet device plugin of one node (k8s/device_plugin/).

Runs in the device-plugin DaemonSet: discover the GPUs (NVML, or ``--simulate``), then serve
``gpuslice.io/gpu`` shares and ``gpuslice.io/mig-<profile>`` instances to the kubelet until SIGTERM.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from gpuslice.cli import terminal
from gpuslice.cli.options import (
    InstanceOption,
    KubeconfigOption,
    NodeNameOption,
    SimulateOption,
    port_option,
    resolve_node_name,
)
from gpuslice.errors import UserError
from gpuslice.inputs import writable_folder
from gpuslice.k8s.annotations import DEFAULT_SPLIT_COUNT, DEFAULT_STATE_DIR, MAX_SPLIT_COUNT
from gpuslice.node.enforcement import DEFAULT_SHARING

__all__ = ["device_plugin"]

_out = terminal.console(highlight=False, soft_wrap=True)


def device_plugin(
    simulate: SimulateOption = None,
    split_count: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_SPLIT_COUNT,
            help=f"shares of gpuslice.io/gpu per GPU, 1..{MAX_SPLIT_COUNT:,}: at most this many pods per GPU",
        ),
    ] = DEFAULT_SPLIT_COUNT,
    socket_dir: Annotated[
        Path, typer.Option(help="the kubelet's device-plugins directory (holds kubelet.sock)")
    ] = Path("/var/lib/kubelet/device-plugins"),
    node_name: NodeNameOption = None,
    kubeconfig: KubeconfigOption = None,
    sharing: Annotated[
        str,
        typer.Option(
            help="how shares are held to their slice: soft (PyTorch cap + graded monitor) or shim (the "
            "preloaded library fences memory and compute); MPS is not offered in pods (docs/kubernetes.md)"
        ),
    ] = DEFAULT_SHARING.value,
    state_dir: Annotated[
        Path, typer.Option(help="host directory of the soft-cap file and the shim, mounted into pods")
    ] = Path(DEFAULT_STATE_DIR),
    mig_layout: Annotated[
        list[str] | None,
        typer.Option(help="MIG instances of a simulated GPU: GPU=PROFILE@START/GI,… (repeatable)"),
    ] = None,
    health_checks: Annotated[
        bool, typer.Option(help="mark GPUs unhealthy on critical XID errors (NVML)")
    ] = True,
    metrics_port: port_option(
        "serve Prometheus metrics (device health, each slice's use) on this port at /metrics; off if unset",
        optional=True,
    ) = None,
    instance: InstanceOption = "",
    daemonset: Annotated[
        str | None,
        typer.Option(
            envvar="GPUSLICE_DAEMONSET",
            help="NAMESPACE/NAME of the DaemonSet this runs in: stopped while it is gone or being deleted "
            "(helm uninstall), the plugin takes back its node annotation, labels and state files",
        ),
    ] = None,
) -> None:
    """Serve this node's GPUs to the kubelet as gpuslice.io/gpu shares and MIG resources until SIGTERM."""
    try:
        from gpuslice.k8s.device_plugin import DevicePlugin, parse_mig_layouts, pod_sharing, serve
    except ImportError as err:  # grpc or the kubernetes client missing
        raise UserError(
            f"the device plugin needs the k8s extra ({err}): pip install 'gpuslice[k8s]'"
        ) from None
    from gpuslice.k8s.uninstall import parse_owner
    from gpuslice.node.discovery import discover

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name = resolve_node_name(node_name)  # before discovery: a bad name is refused at once
    owner = parse_owner(daemonset) if daemonset else None
    pod_sharing(sharing)  # before the API is reached
    # the folders it writes (sockets; soft-cap file and shim), before it registers anywhere
    writable_folder(socket_dir, "--socket-dir")
    writable_folder(state_dir, "--state-dir")
    machine = discover(simulate)
    layouts = parse_mig_layouts(machine, mig_layout) if mig_layout else None

    def ready(plugin: DevicePlugin) -> None:
        resources = ", ".join(f"{r.name} ({len(r.devices)} devices)" for r in plugin.resources)
        _out.print(f"gpuslice device plugin on node {name}: {resources}; sockets in {socket_dir}")

    serve(
        machine,
        name,
        simulated=bool(simulate),
        kubeconfig=str(kubeconfig) if kubeconfig else None,
        split_count=split_count,
        socket_dir=socket_dir,
        sharing=sharing,
        state_dir=state_dir,
        mig_layouts=layouts,
        health_checks=health_checks,
        on_ready=ready,
        metrics_port=metrics_port,
        daemonset=owner,
        instance=instance,
    )
