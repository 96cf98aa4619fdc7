"""``gpuslice k8s dra-driver``: the DRA driver of one node (k8s/dra/).

Runs in the DRA DaemonSet: discover the GPUs (NVML, or ``--simulate``), publish the node's
ResourceSlices, serve the kubelet's DRA plugin API until SIGTERM. ``--print-slices`` and
``--print-classes`` write the objects as YAML instead, for review or ``kubectl apply -f -``.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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
from gpuslice.k8s.annotations import DEFAULT_STATE_DIR
from gpuslice.node.enforcement import DEFAULT_SHARING

if TYPE_CHECKING:
    from gpuslice.hardware.machine import Machine
    from gpuslice.k8s.dra.driver import DraDriver
    from gpuslice.k8s.dra.kube import DraApi
    from gpuslice.node.gpu_faults import HealthSource

__all__ = ["dra_driver"]

_out = terminal.console(highlight=False, soft_wrap=True)


def dra_driver(
    simulate: SimulateOption = None,
    node_name: NodeNameOption = None,
    kubeconfig: KubeconfigOption = None,
    plugins_dir: Annotated[
        Path,
        typer.Option(help="the kubelet's plugins directory; the DRA socket goes in <dir>/gpu.gpuslice.io/"),
    ] = Path("/var/lib/kubelet/plugins"),
    registry_dir: Annotated[
        Path, typer.Option(help="the kubelet's plugins_registry directory (the registration socket)")
    ] = Path("/var/lib/kubelet/plugins_registry"),
    cdi_dir: Annotated[
        Path,
        typer.Option(help="where the container runtime reads CDI specs (containerd, CRI-O: /var/run/cdi)"),
    ] = Path("/var/run/cdi"),
    sharing: Annotated[
        str,
        typer.Option(
            help="how shares are held to their slice: soft (PyTorch cap) or shim (preloaded library)"
        ),
    ] = DEFAULT_SHARING.value,
    state_dir: Annotated[
        Path, typer.Option(help="host directory of the soft-cap file, the shim and the driver's checkpoint")
    ] = Path(DEFAULT_STATE_DIR),
    instance: InstanceOption = "",
    daemonset: Annotated[
        str | None,
        typer.Option(
            envvar="GPUSLICE_DAEMONSET",
            help="NAMESPACE/NAME of the DaemonSet this runs in: stopped while it is gone or being deleted "
            "(helm uninstall), the driver deletes the node's ResourceSlices and, unless a claim is still "
            "prepared, its CDI specs, checkpoint and state files",
        ),
    ] = None,
    metrics_port: port_option(
        "serve Prometheus metrics (each prepared claim's slice, and what the shim measures of it) on this "
        "port at /metrics; off if unset",
        optional=True,
    ) = None,
    print_slices: Annotated[
        bool, typer.Option("--print-slices", help="print this node's ResourceSlices as YAML and exit")
    ] = False,
    print_classes: Annotated[
        bool, typer.Option("--print-classes", help="print gpuslice's DeviceClasses as YAML and exit")
    ] = False,
) -> None:
    """Publish this node's GPUs as DRA ResourceSlices; prepare their claims for the kubelet until SIGTERM."""
    import yaml

    from gpuslice.k8s.dra.classes import device_classes

    if print_classes:
        typer.echo(yaml.safe_dump_all(device_classes(), sort_keys=False), nl=False)
        return
    from gpuslice.k8s.container_slice import pod_sharing

    mode = pod_sharing(sharing)
    from gpuslice.k8s.dra.identity import gpu_identities
    from gpuslice.k8s.dra.slices import node_slices
    from gpuslice.k8s.uninstall import parse_owner
    from gpuslice.node.discovery import discover

    name = resolve_node_name(node_name)  # before discovery: a bad name is refused at once
    owner = parse_owner(daemonset) if daemonset else None
    machine = discover(simulate)
    if print_slices:
        slices = node_slices(machine, name, generation=1, identities=gpu_identities(machine))
        typer.echo(yaml.safe_dump_all(slices, sort_keys=False), nl=False)
        return
    # the folders it writes (sockets, CDI specs, checkpoint and state files), before it publishes anything
    for folder, option in ((plugins_dir, "--plugins-dir"), (registry_dir, "--registry-dir"),
                           (cdi_dir, "--cdi-dir"), (state_dir, "--state-dir")):  # fmt: skip
        writable_folder(folder, option)
    try:
        from gpuslice.k8s.dra.driver import DraDriver
        from gpuslice.k8s.dra.kube import DraApi
    except ImportError as err:  # grpc or the kubernetes client missing
        raise UserError(f"the DRA driver needs the k8s extra ({err}): pip install 'gpuslice[k8s]'") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api = DraApi(str(kubeconfig) if kubeconfig else None)
    driver = DraDriver(
        machine,
        name,
        api,
        cdi_dir=cdi_dir,
        state_dir=state_dir,
        sharing=mode,
        plugins_dir=plugins_dir,
        registry_dir=registry_dir,
        instance=instance,
        health=_health(machine, simulated=bool(simulate)),
    )
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    stop_metrics = None
    try:
        driver.start()
        if metrics_port is not None:
            from prometheus_client import CollectorRegistry

            from gpuslice.k8s.node_metrics import dra_collector
            from gpuslice.observe.metrics_server import serve_metrics

            registry = CollectorRegistry()
            registry.register(
                dra_collector(machine, driver.preparer, driver.plugin, simulated=bool(simulate))
            )
            stop_metrics = serve_metrics(registry, metrics_port)
        _out.print(
            f"gpuslice DRA driver on node {name}: {machine.gpu_count} GPUs in pool {name} (generation "
            f"{driver.generation}); kubelet socket {driver.plugin.endpoint}"
        )
        while not done.wait(1.0):
            pass
    finally:
        if stop_metrics is not None:
            stop_metrics()
        driver.stop()
        if owner is not None:
            _forget_if_removed(driver, api, owner)
        api.close()


def _forget_if_removed(driver: DraDriver, api: DraApi, owner: tuple[str, str]) -> None:
    """At a stop while the DaemonSet is gone or being deleted, take back the pool and the node's files."""
    from gpuslice.k8s.uninstall import daemonset_gone

    if not daemonset_gone(api.api_client, *owner):
        return
    log = logging.getLogger(__name__)
    try:
        kept = driver.forget()
    except Exception as err:  # the API server away, a MIG command refused: the next install overwrites
        log.error("gpuslice is being removed, but node %s could not be cleared: %s", driver.node_name, err)
        return
    left = f"; kept {'; '.join(kept)}" if kept else ""
    log.info("gpuslice is being removed: node %s cleared%s", driver.node_name, left)


def _health(machine: Machine, *, simulated: bool) -> HealthSource:
    """XID events from NVML on a real node; nothing ever breaks on a simulated one."""
    from gpuslice.node.gpu_faults import FakeHealthSource, NvmlHealthSource

    return FakeHealthSource() if simulated else NvmlHealthSource(machine)
