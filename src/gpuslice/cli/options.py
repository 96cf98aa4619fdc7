"""Options more than one command takes, written once (typer reads them from ``Annotated`` hints)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["KubeconfigOption", "NodeNameOption", "SimulateOption", "target_workload_option"]

# The node components' and the cluster components' common options (device plugin, DRA driver, allocator).
SimulateOption = Annotated[
    str | None,
    typer.Option(help="simulate a machine (dgx-h100, dgx-a100:mig, …) instead of reading NVML"),
]
NodeNameOption = Annotated[
    str | None,
    typer.Option(help="this node's Kubernetes name [env NODE_NAME, from the downward API; else hostname]"),
]
KubeconfigOption = Annotated[
    Path | None,
    typer.Option(help="kubeconfig file; default: the pod's service account, then ~/.kube/config"),
]


def target_workload_option(default: str) -> Any:
    """``--target-workload PATH``: the workload FGD-style placement keeps room for, as serve and the
    Kubernetes extender take it; ``default`` says what is used without it."""
    return Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="CSV of representative pods in openb's pod-list format (num_gpu, gpu_milli, …): the "
            f"workload fgd keeps room for; default: {default}",
        ),
    ]
