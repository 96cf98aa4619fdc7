"""``gpuslice sim replay``: the timed replay of openb traces (arrivals, queue, ends); JCT and waits."""

from __future__ import annotations

import math
from itertools import product
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.cli.options import writable
from gpuslice.errors import UserError
from gpuslice.hardware.topology_profiles import profile
from gpuslice.policies import DEFAULT_PLACEMENT
from gpuslice.sim.queue_setups import SETUPS, estimates_for, queue_setup
from gpuslice.sim.timed_metrics import TimedResult, write_timed_results
from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
from gpuslice.sim.timed_trace import load_timed_trace, repeat_trace
from gpuslice.sim.trace import DEFAULT_TRACE

__all__ = ["REPLAY_EPILOG", "check_load", "replay"]

REPLAY_EPILOG = "Queue setups:\n\n" + "\n\n".join(
    f"{s.name}: queue policy {s.queue}, backfill {'on' if s.backfill else 'off'}, {s.estimate} run times"
    for s in SETUPS.values()
)


def check_load(value: float, option: str = "--load") -> float:
    """A compression factor: a positive, finite number (UserError otherwise)."""
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{option} {value:g}: must be a positive, finite number (1 = the trace's own pace)")
    return value


def replay(
    trace: Annotated[
        list[str] | None,
        typer.Option(
            help=f"openb trace with timestamps, repeatable. Default: {DEFAULT_TRACE}.", show_default=False
        ),
    ] = None,
    trace_dir: Annotated[
        Path | None,
        typer.Option(help="Folder of openb CSVs; default: the bundled data.", exists=True, file_okay=False),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Placement policy or policy file, repeatable. Default: {DEFAULT_PLACEMENT}.",
            show_default=False,
        ),
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            help="Queue setup (list below), or a queue policy name or file, repeatable. Default: fair-share.",
            show_default=False,
        ),
    ] = None,
    load: Annotated[
        list[float] | None,
        typer.Option(
            help="Arrival compression, repeatable: arrivals at creation_time / LOAD. Default: 1.",
            show_default=False,
        ),
    ] = None,
    repeat: Annotated[
        int,
        typer.Option(
            min=1,
            help="Play the trace this many times back to back, as a stream: each pod is made when it "
            "arrives and dropped when it ends (memory stays flat; --repeat 14 is ~100,000 pods).",
        ),
    ] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the placement policy's randomness.")] = 42,
    out: Annotated[
        Path, typer.Option(help="Folder for results.csv, results.json, plots.", callback=writable)
    ] = Path("results"),
    plot: Annotated[bool, typer.Option(help="Also write a PNG per trace and load.")] = False,
    topology: Annotated[
        str | None,
        typer.Option(
            help="Machine profile (as in `topo show --system`) wired into every node with its GPU count: "
            "multi-GPU pods arriving together there get their GPU sets jointly. Default: no wiring.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Replay pods at their trace times: they wait in serve's queue, run for their recorded duration on the
    Placer's choice, and leave. Censored pods (running at the trace's end) hold GPUs for their recorded part
    and are left out of JCT and wait figures; pods production never started are not replayed."""
    loads = [check_load(x) for x in (load or [1.0])]
    if topology is not None:
        profile(topology)  # an unknown name is refused before any replay starts
    setups = [queue_setup(q) for q in (queue or ["fair-share"])]
    policies = policy or [DEFAULT_PLACEMENT]
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file: give a folder for the results")
    traces = [repeat_trace(load_timed_trace(t, trace_dir), repeat) for t in (trace or [DEFAULT_TRACE])]
    console = terminal.console()
    runs = list(product(traces, setups, policies, loads))
    results: list[TimedResult] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("replaying", total=len(runs))
        estimates: dict[tuple[str, str], object] = {}
        for timed, setup, placement, factor in runs:
            progress.update(task, description=f"{timed.name} {placement} {setup.name} load {factor:g}")
            key = (timed.name, setup.estimate)
            if key not in estimates:
                estimates[key] = estimates_for(timed.jobs, setup, seed)
            config = ReplayConfig(
                placement, setup.queue, setup.backfill, factor, seed, label=setup.name, topology=topology
            )
            results.append(replay_timed(timed, config, estimates[key]))  # type: ignore[arg-type]
            progress.update(task, advance=1)
    console.print(_table(results))
    for r in results:  # MIG pods: the table's alloc % leaves their GPUs out, so say how they fared
        mig = r.record().get("mig")
        if mig is not None:
            wait = mig["wait_s"]  # type: ignore[index]
            console.print(
                f"MIG ({r.trace}, {r.placement}, {r.queue}, load {r.load:g}): {mig['pods']:,} pods, "  # type: ignore[index]
                f"{mig['started']:,} started, wait mean {_s(wait['mean'])} s, p99 {_s(wait['p99'])} s",
                markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
    written = write_timed_results(results, out)
    if plot:
        from gpuslice.sim.timed_plot import write_timed_plots  # matplotlib: only load it when asked

        written += write_timed_plots(results, out)
    for path in written:
        console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


def _s(value: object) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _table(results: list[TimedResult]) -> Table:
    table = Table(
        title="Timed replay: JCT and queueing delay of finished pods (s); production's recorded wait beside",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        show_edge=False,
    )
    for header in ("trace", "policy", "queue", "load"):
        table.add_column(header, no_wrap=True)
    for header in (
        "JCT mean",
        "JCT p99",
        "wait mean",
        "wait p99",
        "trace wait",
        "alloc %",
        "preempt",
        "unstarted",
    ):
        table.add_column(header, justify="right", no_wrap=True)
    for r in results:
        rec = r.record()
        jct, wait, recorded = (rec[k]["all"] for k in ("jct_s", "wait_s", "recorded_wait_s"))  # type: ignore[index]
        table.add_row(
            r.trace,
            r.placement,
            r.queue,
            f"{r.load:g}",
            _s(jct["mean"]),
            _s(jct["p99"]),
            _s(wait["mean"]),
            _s(wait["p99"]),
            _s(recorded["mean"]),
            "—" if rec["mean_allocation_pct"] is None else f"{rec['mean_allocation_pct']:.2f}",
            str(rec["preemptions"]),
            str(rec["never_started"]),
        )
    return table
