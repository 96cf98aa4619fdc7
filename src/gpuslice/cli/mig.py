"""``gpuslice mig plan`` and ``gpuslice mig profiles``: MIG placements and the nvidia-smi commands.

Parse, call ``scheduler.mig_planner.plan``, present: a slot diagram, a placement table, the commands.
User errors are gpuslice UserErrors; the root app turns them into one line and exit 2.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.errors import UserError
from gpuslice.hardware.mig import MEMORY_SLICES, MIG_GPUS, MigGpu, MigLayout, mig_gpu, parse_layout
from gpuslice.hardware.node import MAX_GPU_INDEX
from gpuslice.policies.mig_placement import DEFAULT_MIG_PLACEMENT, MIG_PLACEMENT, mig_placement_policy
from gpuslice.scheduler.mig_planner import MigPlan
from gpuslice.scheduler.mig_planner import plan as make_plan
from gpuslice.units import format_size

__all__ = ["REJECTED_EXIT", "app", "plan", "profile_rows", "profiles", "slot_diagram"]

REJECTED_EXIT = 3  # `mig plan`: some request could not be placed (scripts can tell it from a user error)

app = typer.Typer(
    help="MIG geometry: profile tables, placements, and the nvidia-smi mig commands.", no_args_is_help=True
)

_GPUS = ", ".join(g.name for g in MIG_GPUS.values())  # any case is accepted
_POLICIES = ", ".join(f"{n} ({c.summary})" for n, c in MIG_PLACEMENT.items())


def slot_diagram(layout: MigLayout) -> str:
    """One row per instance over memory slices 0–7: '#' where it sits; idle instances marked."""
    rows = ["slot      " + " ".join(str(s) for s in range(MEMORY_SLICES))]
    for inst in sorted(layout.instances, key=lambda i: i.start):
        cells = " ".join("#" if inst.mask >> s & 1 else "." for s in range(MEMORY_SLICES))
        rows.append(f"{inst.profile.name:<10.10}{cells}{'  idle' if inst.idle else ''}")
    free = " ".join("." if layout.mask >> s & 1 else "-" for s in range(MEMORY_SLICES))
    rows.append(f"{'free':<10}{free}")
    return "\n".join(rows)


@app.command()
def plan(
    gpu: Annotated[str, typer.Option(help=f"MIG GPU model: {_GPUS}.")],
    request: Annotated[
        list[str],
        typer.Option(help="Profile name or -lgip ID (3g.40gb, 9) or memory (12GiB); repeatable, in order."),
    ],
    policy: Annotated[str, typer.Option(help=f"Placement policy: {_POLICIES}.")] = DEFAULT_MIG_PLACEMENT,
    from_layout: Annotated[
        str | None,
        typer.Option(
            help="Current instances, comma-separated: PROFILE@START, optionally /GI_ID after the start "
            "and :idle at the end, e.g. 3g.40gb@4/2,1g.10gb@0/9:idle.",
            show_default=False,
        ),
    ] = None,
    from_nvml: Annotated[
        bool, typer.Option(help="Read the current layout from NVML (nvidia-ml-py).")
    ] = False,
    gpu_index: Annotated[
        int, typer.Option(min=0, max=MAX_GPU_INDEX, help="Physical GPU index for nvidia-smi -i.")
    ] = 0,
) -> None:
    """Place MIG requests on one GPU; print the slots, the placements and the nvidia-smi commands.

    Exit status 3 when a request could not be placed (the others are still planned and printed).
    """
    model = mig_gpu(gpu)
    chosen = mig_placement_policy(policy)()
    if from_layout and from_nvml:
        raise UserError("give --from-layout or --from-nvml, not both")
    layout = parse_layout(model, from_layout) if from_layout else None
    if from_nvml:
        from gpuslice.hardware.mig_nvml import read_layout

        layout = read_layout(gpu_index)
        if layout.gpu != model:
            raise UserError(f"GPU {gpu_index} is a {layout.gpu.name}, not a {model.name}: fix --gpu")
    result = make_plan(model, request, chosen, layout, gpu_index)
    _print_plan(terminal.console(), result)
    if result.rejected:
        raise typer.Exit(REJECTED_EXIT)


def _print_plan(console: Console, result: MigPlan) -> None:
    gpu = result.after.gpu
    console.print(f"{gpu.name}, policy {result.policy}", markup=False, highlight=False)
    console.print(slot_diagram(result.after), markup=False, highlight=False)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for header in ("request", "profile", "start", "slots", "memory", "how"):
        table.add_column(header, no_wrap=True)
    for p in result.placed:
        inst = p.instance
        slots = f"{inst.start}-{inst.start + inst.profile.memory_slices - 1}"
        how = "reuse idle" if p.reused else "create"
        table.add_row(
            p.request, inst.profile.name, str(inst.start), slots, format_size(inst.profile.memory_bytes), how
        )
    console.print(table)
    for r in result.rejected:
        console.print(f"rejected {r.request}: {r.reason}", markup=False, highlight=False, soft_wrap=True)
    console.print("commands:" if result.commands else "commands: none", markup=False, highlight=False)
    for command in result.commands:
        console.print(f"  {command}", markup=False, highlight=False, soft_wrap=True)


def profile_rows(model: MigGpu) -> list[dict[str, object]]:
    """One dict per profile, the shape of ``mig profiles --json``: what ``nvidia-smi mig -lgip`` lists."""
    return [
        {
            "profile": p.name,
            "id": p.profile_id,
            "nvml_constant": p.nvml_constant,
            "memory_bytes": p.memory_bytes,
            "compute_slices": p.compute_slices,
            "memory_slices": p.memory_slices,
            "starts": list(p.starts),
            "max_count": p.max_count,
            "sms": p.sm_count,
        }
        for p in model.profiles
    ]


@app.command()
def profiles(
    gpu: Annotated[str, typer.Option(help=f"MIG GPU model: {_GPUS}.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON, for scripts.")] = False,
) -> None:
    """The GPU-instance profile table: IDs, memory, slices, allowed starts and SMs."""
    model = mig_gpu(gpu)
    if as_json:
        typer.echo(json.dumps({"gpu": model.name, "profiles": profile_rows(model)}, indent=1))
        return
    table = Table(title=f"{model.name}: {model.description}", box=box.SIMPLE_HEAD, show_edge=False)
    # Fits 80 columns: compute and memory slices share a column; the NVML constant is in --json.
    for header in ("profile", "ID", "memory", "slices c/m", "starts", "max", "SMs"):
        table.add_column(header, no_wrap=True, justify="left" if header == "profile" else "right")
    for p in model.profiles:
        table.add_row(
            p.name,
            str(p.profile_id),
            format_size(p.memory_bytes),
            f"{p.compute_slices}/7 {p.memory_slices}/8",
            ",".join(map(str, p.starts)),
            str(p.max_count),
            str(p.sm_count),
        )
    terminal.console().print(table)
