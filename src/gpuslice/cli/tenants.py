"""``gpuslice tenants list|show|set``: a client of ``gpuslice serve`` for tenants' weights and quotas.

GPUs count as the quotas count them: whole GPUs 1 each, a share the larger of its memory and compute
fractions of its GPU (a 40 GiB share of an 80 GiB GPU is 0.5), a MIG instance its compute slices / 7.
The server decides; this module parses, calls and prints.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gpuslice.cli import jobs as job_cli
from gpuslice.cli.jobs import StateDir, Url
from gpuslice.cli.terminal import console
from gpuslice.errors import UserError
from gpuslice.hardware.node import MAX_GPUS_PER_NODE
from gpuslice.inputs import finite_float
from gpuslice.server.client import ServerError
from gpuslice.units import format_size, parse_size
from gpuslice.workload.job import MAX_TENANT_WEIGHT

__all__ = ["app"]

app = typer.Typer(
    help="Tenants (teams) of gpuslice serve: fair-share weight, GPU and GPU-memory quotas, usage now.",
    no_args_is_help=True,
)
_out = console(highlight=False, soft_wrap=True)
_UNLIMITED = "none"


def _quota(row: dict[str, Any]) -> str:
    parts = []
    if row["max_gpus"] is not None:
        parts.append(f"{row['max_gpus']:g} GPUs")
    if row["max_gpu_memory_bytes"] is not None:
        parts.append(format_size(row["max_gpu_memory_bytes"]))
    return " · ".join(parts) or "no limit"


@app.command("list")
def list_tenants(url: Url = None, state_dir: StateDir = None) -> None:
    """Every tenant with its weight, quota and what its jobs hold now."""
    with job_cli._client(url, state_dir) as client:  # the jobs commands' one client
        rows = client.tenants()
    table = Table("TENANT", "WEIGHT", "QUOTA", "GPUS IN USE", "GPU MEMORY IN USE", "RUNNING", "PENDING",
                  "NEVER FIT", box=None)  # fmt: skip
    for r in rows:
        memory, never = format_size(r["gpu_memory_in_use_bytes"]), ", ".join(r["never_fit_jobs"]) or "—"
        table.add_row(escape(r["name"]), f"{r['weight']:g}", _quota(r), f"{r['gpus_in_use']:g}", memory,
                      str(r["running_jobs"]), str(r["pending_jobs"]), never)  # fmt: skip
    _out.print(table)


def _print(row: dict[str, Any]) -> None:
    lines = [
        ("tenant", row["name"]),
        ("weight", f"{row['weight']:g}"),
        ("quota", _quota(row)),
        ("gpus in use", f"{row['gpus_in_use']:g} (a share counts the larger of its memory and compute "
                        "fractions of its GPU)"),
        ("gpu memory in use", format_size(row["gpu_memory_in_use_bytes"])),
        ("jobs", f"{row['running_jobs']} running, {row['pending_jobs']} pending"),
        ("never fit quota", ", ".join(row["never_fit_jobs"]) or "—"),
    ]  # fmt: skip
    for key, value in lines:
        _out.print(f"[bold]{key:>17}[/bold]  {escape(value)}")


Name = Annotated[str, typer.Argument(help="the tenant (team), as jobs name it with --tenant")]


@app.command("show")
def show(name: Name, url: Url = None, state_dir: StateDir = None) -> None:
    """One tenant: weight, quota, usage now, and its pending jobs that can never fit the quota."""
    with job_cli._client(url, state_dir) as client:  # the jobs commands' one client
        _print(client.tenant(name))


def _gpus(text: str) -> float | None:
    if text.strip().lower() == _UNLIMITED:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"--max-gpus: {text!r} is not a number; give e.g. 2, 0.5 or {_UNLIMITED}") from None
    return finite_float(value, "--max-gpus", 0, MAX_GPUS_PER_NODE)


@app.command("set")
def set_tenant(
    name: Name,
    weight: Annotated[
        float | None, typer.Option(help=f"fair-share weight, > 0 and <= {MAX_TENANT_WEIGHT:g} (default 1)")
    ] = None,
    max_gpus: Annotated[
        str | None,
        typer.Option(
            help=f"GPU quota, 0..{MAX_GPUS_PER_NODE}; a share counts the larger of its memory and compute "
            f"fractions of its GPU; '{_UNLIMITED}' removes it"
        ),
    ] = None,
    max_gpu_memory: Annotated[
        str | None, typer.Option(help=f"GPU memory quota with a unit, e.g. 160GiB; '{_UNLIMITED}' removes it")
    ] = None,
    url: Url = None,
    state_dir: StateDir = None,
) -> None:
    """Set a tenant's weight and quotas (what is not given stays as it is; a new tenant starts with
    weight 1 and no limits). A waiting job the new quota can never admit is kept and marked."""
    if weight is not None and not (math.isfinite(weight) and 0 < weight <= MAX_TENANT_WEIGHT):
        raise UserError(
            f"--weight: {weight!r} must be a finite number above 0, at most {MAX_TENANT_WEIGHT:g}"
        )
    # every value is checked before the server is asked anything
    gpus_quota = None if max_gpus is None else _gpus(max_gpus)
    memory_quota = None
    if max_gpu_memory is not None and max_gpu_memory.strip().lower() != _UNLIMITED:
        try:
            memory_quota = parse_size(max_gpu_memory)
        except UserError as err:
            raise UserError(f"--max-gpu-memory: {err}") from None
    with job_cli._client(url, state_dir) as client:  # the jobs commands' one client
        try:
            row = client.tenant(name)
        except ServerError as err:
            if err.status != 404:
                raise
            row = {"weight": 1.0, "max_gpus": None, "max_gpu_memory_bytes": None, "response": {}}
        body = {
            "weight": row["weight"] if weight is None else weight,
            "max_gpus": row["max_gpus"] if max_gpus is None else gpus_quota,
            "max_gpu_memory": row["max_gpu_memory_bytes"] if max_gpu_memory is None else memory_quota,
            "response": row["response"],
        }
        _print(client.put_tenant(name, body))
