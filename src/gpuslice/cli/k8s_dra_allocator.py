"""``gpuslice k8s dra-allocator``: gpuslice's placement for DRA claims (k8s/dra/allocator.py).

Pods with the scheduling gate ``gpuslice.io/dra-allocate`` get their claims allocated by the placement
policy (node and GPUs), then lose the gate; kube-scheduler binds them where the allocation says.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Annotated

import typer

from gpuslice.cli import terminal
from gpuslice.cli.options import KubeconfigOption, finite_between, port_option, target_workload_option
from gpuslice.policies import DEFAULT_PLACEMENT, PLACEMENT

__all__ = ["dra_allocator"]

_out = terminal.console(highlight=False, soft_wrap=True)


def dra_allocator(
    kubeconfig: KubeconfigOption = None,
    policy: Annotated[
        str, typer.Option(help=f"placement policy deciding node and GPUs: {', '.join(sorted(PLACEMENT))}")
    ] = DEFAULT_PLACEMENT,
    interval: Annotated[
        float,
        typer.Option(
            callback=finite_between(0.05, 3600),
            help="seconds between passes when no gated pod waits, 0.05..3600",
        ),
    ] = 0.5,
    target_workload: target_workload_option("the claims allocated when each pass begins") = None,
    metrics_port: port_option(
        "serve Prometheus metrics (the pools' GPUs, pending pods, preemptions) on this port at /metrics; "
        "off if unset",
        optional=True,
    ) = None,
) -> None:
    """Allocate the claims of gated pods with gpuslice's placement policy, then ungate them, until SIGTERM."""
    from gpuslice.k8s.dra.allocator import GATE, DraAllocator
    from gpuslice.k8s.dra.kube import DraApi
    from gpuslice.policies import placement_policy
    from gpuslice.sim.trace import load_target_workload

    placement_policy(policy)  # an unknown name: one error line listing the known ones
    target = load_target_workload(target_workload) if target_workload is not None else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api = DraApi(str(kubeconfig) if kubeconfig else None)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    allocator = DraAllocator(api, policy, target)
    stop_metrics = None
    try:
        if metrics_port is not None:
            from gpuslice.k8s.dra.pool_metrics import DraMetrics
            from gpuslice.observe.metrics_server import serve_metrics

            stop_metrics = serve_metrics(DraMetrics(api, allocator).registry, metrics_port)
        _out.print(f"gpuslice DRA allocator, policy {policy}: allocating claims of pods gated by {GATE}")
        allocator.run(done, interval)
    finally:
        if stop_metrics is not None:
            stop_metrics()
        api.close()
