"""``gpuslice memsim``: replay a memory workload under eviction × prefetch policies; table, JSON, PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from gpuslice.errors import UserError
from gpuslice.memory import EVICTION, PREFETCH, SimConfig, make_workload, simulate
from gpuslice.memory.cost import CostModel, load_cost_profile
from gpuslice.memory.workloads import read_trace_csv
from gpuslice.programs.loader import memory_ops

__all__ = ["app", "memsim"]

app = typer.Typer(help="Simulate GPU memory oversubscription under gpu_ext-style policies.")


@app.command()
def memsim(
    workload: Annotated[
        str, typer.Option(help="Workload name (see gpuslice.memory.WORKLOADS).")
    ] = "llm-moe-decode",
    oversub: Annotated[float, typer.Option(min=1.0, help="Working set / GPU capacity, e.g. 1.5.")] = 1.5,
    evict: Annotated[
        str, typer.Option(help=f"Eviction policy: {', '.join(EVICTION)}, or a policy file (.py).")
    ] = "default",
    prefetch: Annotated[
        str, typer.Option(help=f"Prefetch policy: {', '.join(PREFETCH)}, or a policy file (.py).")
    ] = "tree",
    tenants: Annotated[str | None, typer.Option(help="Priorities, e.g. '0=high,1=low'.")] = None,
    trace: Annotated[
        Path | None, typer.Option(help="Replay a CSV trace (tenant,block,page,op,time).")
    ] = None,
    compare: Annotated[str | None, typer.Option(help="'all': every eviction policy incl. belady.")] = None,
    visibility: Annotated[str, typer.Option(help="Access hook: driver (never fires) or full.")] = "driver",
    scale: Annotated[float, typer.Option(min=0.01, help="Workload size factor.")] = 1.0,
    plot: Annotated[bool, typer.Option(help="Write memsim.png to --out.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print results as a JSON list.")] = False,
    cost_profile: Annotated[
        Path | None,
        typer.Option(
            help="Cost profile JSON (link bytes/s, fault-batch s, per-access s); docs/cost-profile.md."
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder for the PNG.")] = Path("results"),
) -> None:
    """Faults, bytes and estimated time of one policy pair, or of every eviction policy with --compare all."""
    if compare not in (None, "all"):
        raise UserError(f"invalid --compare {compare!r}: the only value is 'all'")
    priorities = None
    if tenants:
        try:
            priorities = {int(k): v for k, v in (p.split("=") for p in tenants.split(","))}
        except ValueError:
            raise UserError(f"invalid --tenants {tenants!r}: use e.g. 0=high,1=low") from None
    evicts = list(EVICTION) if compare else [evict]
    pairs = [(e, prefetch) for e in dict.fromkeys([*evicts, "default", "belady"])]
    if (evict, prefetch) != ("default", "tree"):
        pairs.append(("default", "tree"))
    for e, p in pairs:
        memory_ops(e, p)  # validate every name, verify every policy file, before any work
    cost = load_cost_profile(cost_profile) if cost_profile else CostModel()
    data = read_trace_csv(trace) if trace else make_workload(workload, scale=scale)
    cfg = SimConfig(oversub=oversub, visibility=visibility, priorities=priorities, cost=cost)
    results = {}
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), disable=as_json
    ) as bar:
        task = bar.add_task(f"{data.name} ×{oversub}", total=len(pairs) * len(data))
        for e, p in dict.fromkeys(pairs):
            ops = memory_ops(e, p)  # a file's result is labelled with its path
            results[(e, p)] = simulate(data, ops, cfg, e, p, progress=lambda k: bar.advance(task, k))
    shown = [results[(e, prefetch)] for e in evicts]
    if compare and ("belady", prefetch) not in [(r.evict, r.prefetch) for r in shown]:
        shown.append(results[("belady", prefetch)])
    if as_json:
        print(json.dumps([r.as_dict() for r in shown], indent=1))
        return
    bound, base = results[("belady", prefetch)], results[("default", "tree")]
    costs = f"costs: {cost.name or cost.link}"
    table = Table(title=f"{data.name} at {oversub}× oversubscription ({len(data):,} accesses; {costs})")
    for col in (
        "evict",
        "prefetch",
        "faults",
        "×Belady",
        "evictions",
        "migrated MiB",
        "est. s",
        "speedup vs default",
    ):
        table.add_column(col, justify="left" if col in ("evict", "prefetch") else "right")
    for r in shown:
        table.add_row(
            r.evict,
            r.prefetch,
            f"{r.faults:,}",
            f"{r.faults / max(1, bound.faults):.2f}",
            f"{r.evictions:,}",
            f"{r.migrated_bytes / 2**20:,.0f}",
            f"{r.estimated_seconds:.4f}",
            f"{base.estimated_seconds / r.estimated_seconds:.2f}×",
        )
    Console().print(table)
    if plot:
        _plot(shown, base, out / "memsim.png", f"{data.name} ×{oversub}")


def _plot(results, base, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(
        [f"{r.evict}\n{r.prefetch}" for r in results],
        [base.estimated_seconds / r.estimated_seconds for r in results],
    )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("speedup over driver default")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    Console().print(f"wrote {path}")
