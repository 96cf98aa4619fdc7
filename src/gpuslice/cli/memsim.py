"""``gpuslice memsim``: replay a memory workload under eviction × prefetch policies; table, JSON, PNG."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.cli.options import finite_between
from gpuslice.cli.progress import WorkProgress
from gpuslice.errors import UserError
from gpuslice.inputs import writable_folder
from gpuslice.memory import EVICTION, PREFETCH, SimConfig, make_workload, simulate
from gpuslice.memory.cost import CostModel, load_cost_profile
from gpuslice.memory.hooks import PRIORITY_HIGH, PRIORITY_LOW, VISIBILITIES
from gpuslice.memory.policies import DEFAULT_EVICTION, DEFAULT_PREFETCH
from gpuslice.memory.simulator import SimResult
from gpuslice.memory.workloads import WORKLOADS, Trace, read_trace_csv
from gpuslice.programs.guard import GuardConfig
from gpuslice.programs.loader import is_policy_path, memory_ops
from gpuslice.programs.run_isolation import isolated_run

__all__ = ["MAX_OVERSUB", "MAX_SCALE", "app", "memsim"]

MAX_OVERSUB = 100.0  # a working set 100× the GPU: every access faults long before this
MAX_SCALE = 16.0  # time and memory grow linearly with it: 16 is ~1 GB and ~12 s (benchmarks/RESULTS.md)

app = typer.Typer(help="Simulate GPU memory oversubscription under gpu_ext-style policies.")


@app.command()
def memsim(
    workload: Annotated[str, typer.Option(help=f"Workload: {', '.join(WORKLOADS)}.")] = "llm-moe-decode",
    oversub: Annotated[
        float,
        typer.Option(
            help=f"Working set / GPU capacity, 1..{MAX_OVERSUB:g}, e.g. 1.5.",
            callback=finite_between(1.0, MAX_OVERSUB),
        ),
    ] = 1.5,
    evict: Annotated[
        str, typer.Option(help=f"Eviction policy: {', '.join(EVICTION)}, or a policy file (.py).")
    ] = DEFAULT_EVICTION,
    prefetch: Annotated[
        str, typer.Option(help=f"Prefetch policy: {', '.join(PREFETCH)}, or a policy file (.py).")
    ] = DEFAULT_PREFETCH,
    tenants: Annotated[
        str | None, typer.Option(help="Tenant priorities, high or low, e.g. 0=high,1=low.")
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(help="Replay a CSV trace (tenant,block,page,op,time).", exists=True, dir_okay=False),
    ] = None,
    compare: Annotated[str | None, typer.Option(help="'all': every eviction policy incl. belady.")] = None,
    visibility: Annotated[
        str, typer.Option(help="When the access hook runs: driver (never, as the driver) or full.")
    ] = "driver",
    scale: Annotated[
        float,
        typer.Option(
            help=f"Workload size factor, 0.01..{MAX_SCALE:g}.", callback=finite_between(0.01, MAX_SCALE)
        ),
    ] = 1.0,
    plot: Annotated[bool, typer.Option(help="Write memsim.png to --out.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print results as a JSON list.")] = False,
    cost_profile: Annotated[
        Path | None,
        typer.Option(
            help="Cost profile JSON (link bytes/s, fault-batch s, per-access s); docs/cost-profile.md."
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Folder for the PNG (with --plot; checked before the run).")
    ] = Path("results"),
) -> None:
    """Simulate GPU memory oversubscription: faults, bytes moved and estimated time per eviction × prefetch
    policy pair (every eviction policy with --compare all)."""
    if compare not in (None, "all"):
        raise UserError(f"invalid --compare {compare!r}: the only value is 'all'")
    if visibility not in VISIBILITIES:
        raise UserError(f"invalid --visibility {visibility!r}: use {' or '.join(VISIBILITIES)}")
    if plot:
        writable_folder(out, "--out")
    priorities = _parse_tenants(tenants) if tenants else None
    evicts = list(EVICTION) if compare else [evict]
    pairs = [(e, prefetch) for e in dict.fromkeys([*evicts, DEFAULT_EVICTION, "belady"])]
    if (evict, prefetch) != (DEFAULT_EVICTION, DEFAULT_PREFETCH):
        pairs.append((DEFAULT_EVICTION, DEFAULT_PREFETCH))
    for e, p in pairs:
        memory_ops(e, p)  # validate every name, verify every policy file, before any work
    cost = load_cost_profile(cost_profile) if cost_profile else CostModel()
    data = read_trace_csv(trace) if trace else make_workload(workload, scale=scale)
    cfg = SimConfig(oversub=oversub, visibility=visibility, priorities=priorities, cost=cost)
    results = {}
    runs = list(dict.fromkeys(pairs))
    # on stderr (a bar on a terminal, else a line every few seconds): stdout may be --json
    console = terminal.console(stderr=True)
    with WorkProgress(console, "memsim", len(runs) * len(data), "accesses") as progress:
        progress.say(f"memsim: {len(runs)} policy pair(s) × {len(data):,} accesses of {data.name} ×{oversub}")
        done = 0
        for e, p in runs:
            progress.describe(f"{e} + {p}")

            def advance(k: int) -> None:
                nonlocal done
                done += k
                progress.update(done)

            results[(e, p)] = _simulate(data, e, p, cfg, advance)
    faulty = "; ".join(
        f"{r.evict} + {r.prefetch}: " + ", ".join(f"{k} ×{n:,}" for k, n in r.policy_faults.items())
        for r in results.values()
        if r.policy_faults
    )
    if faulty:  # a file's row is partly the driver's: say so, as sim openb does
        err = terminal.console(stderr=True, highlight=False, soft_wrap=True)
        err.print(f"warning: policy files faulted and the driver decided instead ({faulty})", markup=False)
    shown = [results[(e, prefetch)] for e in evicts]
    if compare and ("belady", prefetch) not in [(r.evict, r.prefetch) for r in shown]:
        shown.append(results[("belady", prefetch)])
    if as_json:
        print(json.dumps([r.as_dict() for r in shown], indent=1))
        return
    bound, base = results[("belady", prefetch)], results[(DEFAULT_EVICTION, DEFAULT_PREFETCH)]
    costs = f"costs: {cost.name or cost.link}"
    table = Table(
        title=f"{data.name} at {oversub}× oversubscription ({len(data):,} accesses)",
        caption=f"speedup: estimated time of the driver default / this pair; {costs}",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),  # gaps of one space (the box's)
        show_edge=False,
    )
    # Short headers and no folding: the eight columns fit 80 characters with the longest policy names.
    for col in ("evict", "prefetch", "faults", "×Belady", "evicts", "MiB moved", "est. s", "speedup"):
        table.add_column(col, justify="left" if col in ("evict", "prefetch") else "right", no_wrap=True)
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
    terminal.console().print(table)
    if plot:
        _plot(shown, base, out / "memsim.png", f"{data.name} ×{oversub}")


def _simulate(
    data: Trace, evict: str, prefetch: str, cfg: SimConfig, advance: Callable[[int], None]
) -> SimResult:
    """One pair's run; with a policy file, the whole run in a worker process (``run_isolation``)."""
    if not (is_policy_path(evict) or is_policy_path(prefetch)):
        return simulate(data, memory_ops(evict, prefetch), cfg, evict, prefetch, progress=advance)

    def run(child: GuardConfig, relay: Callable[[int, int], None]) -> SimResult:
        sent = [0]  # accesses done, in the worker process

        def progress(k: int) -> None:
            sent[0] += k
            relay(sent[0], 0)

        ops = memory_ops(evict, prefetch, child)  # a file's result is labelled with its path
        return simulate(data, ops, cfg, evict, prefetch, progress=progress)

    shown = [0]  # accesses the bar shows, here

    def relayed(total: int, _: int) -> None:
        advance(total - shown[0])
        shown[0] = total

    return isolated_run(run, GuardConfig(), relayed)


def _parse_tenants(text: str) -> dict[int, str]:
    """'0=high,1=low' → {0: 'high', 1: 'low'}; UserError names the input and the known priorities."""
    known = (PRIORITY_HIGH, PRIORITY_LOW)
    try:
        pairs = [(int(k), v.strip()) for k, v in (p.split("=") for p in text.split(","))]
    except ValueError:
        raise UserError(f"invalid --tenants {text!r}: use TENANT=PRIORITY pairs, e.g. 0=high,1=low") from None
    for tenant, level in pairs:
        if tenant < 0 or level not in known:
            raise UserError(
                f"invalid --tenants {text!r}: tenant {tenant} = {level!r}; tenants are numbers from 0 "
                f"and priorities {' or '.join(known)}"
            )
    return dict(pairs)


def _figure(results, base, title: str):
    """Speedup over the driver default per policy pair, as horizontal bars: one label per row, so ten
    policy names never overlap as x-axis labels do."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.evict} / {r.prefetch}" for r in results]
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.35 * len(results)))
    ax.barh(labels, [base.estimated_seconds / r.estimated_seconds for r in results])
    ax.invert_yaxis()  # the table's order, top to bottom
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("speedup over the driver default (eviction / prefetch)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def _plot(results, base, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig = _figure(results, base, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    terminal.console().print(f"wrote {path}")
