"""``gpuslice mig plan`` and ``gpuslice mig profiles``: MIG placements and the nvidia-smi commands.

Parse, call ``scheduler.mig_planner.plan``, present: a slot diagram, a placement table, the commands.
User errors are gpuslice UserErrors; the root app turns them into one line and exit 2.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from gpuslice.errors import UserError
from gpuslice.hardware.mig import MEMORY_SLICES, MIG_GPUS, MigLayout, mig_gpu, parse_layout
from gpuslice.policies.mig_placement import MIG_PLACEMENT, mig_placement_policy
from gpuslice.scheduler.mig_planner import MigPlan
from gpuslice.scheduler.mig_planner import plan as make_plan
from gpuslice.units import format_size

__all__ = ["app", "plan", "profiles", "slot_diagram"]

app = typer.Typer(help="MIG geometry: profile tables, placements, and the nvidia-smi mig commands.")

_GPUS = ", ".join(MIG_GPUS)
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
    policy: Annotated[str, typer.Option(help=f"Placement policy: {_POLICIES}.")] = "ours",
    from_layout: Annotated[
        str | None,
        typer.Option(help="Current instances: PROFILE@START[/GI_ID][:idle], comma-separated."),
    ] = None,
    from_nvml: Annotated[
        bool, typer.Option(help="Read the current layout from NVML (nvidia-ml-py).")
    ] = False,
    gpu_index: Annotated[int, typer.Option(min=0, help="Physical GPU index for nvidia-smi -i.")] = 0,
) -> None:
    """Place MIG requests on one GPU; print the slots, the placements and the nvidia-smi commands."""
    model = mig_gpu(gpu)
    chosen = mig_placement_policy(policy)
    if from_layout and from_nvml:
        raise UserError("give --from-layout or --from-nvml, not both")
    layout = parse_layout(model, from_layout) if from_layout else None
    if from_nvml:
        from gpuslice.hardware.mig_nvml import read_layout

        layout = read_layout(gpu_index)
        if layout.gpu != model:
            raise UserError(f"GPU {gpu_index} is a {layout.gpu.key}, not a {model.key}: fix --gpu")
    result = make_plan(model, request, chosen, layout, gpu_index)
    _print_plan(Console(), result)


def _print_plan(console: Console, result: MigPlan) -> None:
    gpu = result.after.gpu
    note = "" if gpu.verified else "  (profile facts inferred: check with nvidia-smi mig -lgip)"
    console.print(f"{gpu.key}, policy {result.policy}{note}", markup=False, highlight=False)
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


@app.command()
def profiles(gpu: Annotated[str, typer.Option(help=f"MIG GPU model: {_GPUS}.")]) -> None:
    """The GPU-instance profile table: IDs, memory, slices and allowed starts."""
    model = mig_gpu(gpu)
    table = Table(title=f"{model.key}: {model.description}", box=box.SIMPLE_HEAD, show_edge=False)
    for header in ("profile", "ID", "NVML const", "memory", "compute", "mem slices", "starts", "max", "SMs"):
        table.add_column(header, no_wrap=True, justify="left" if header == "profile" else "right")
    table.add_column("verified", no_wrap=True)
    for p in model.profiles:
        table.add_row(
            p.name,
            str(p.profile_id),
            hex(p.nvml_constant),
            format_size(p.memory_bytes),
            f"{p.compute_slices}/7",
            f"{p.memory_slices}/8",
            ",".join(map(str, p.starts)),
            str(p.max_count),
            str(p.sm_count),
            "yes" if p.verified else "inferred",
        )
    Console().print(table)
