"""Options more than one command takes, written once (typer reads them from ``Annotated`` hints)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuslice.inputs import finite_float, writable_folder

__all__ = ["finite_between", "target_workload_option", "writable"]


def finite_between(low: float, high: float) -> Callable[..., float | None]:
    """An option callback that refuses a value outside ``low``..``high``, infinity and NaN, naming the
    flag (click's own ranges let ``nan`` through, and ``1e400`` arrives as infinity)."""

    def check(param: typer.CallbackParam, value: float | None) -> float | None:
        return None if value is None else finite_float(value, param.opts[0], low, high)

    return check


def writable(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """An option callback for an output folder: it must be writable before any work starts."""
    return None if value is None else writable_folder(value, param.opts[0])


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
