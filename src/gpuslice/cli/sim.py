"""``gpuslice sim openb``: replay placement policies on openb traces; a table, result files, a plot."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.cli.interrupt import workers_stop_on_interrupt
from gpuslice.cli.options import finite_between, writable
from gpuslice.cli.progress import WorkProgress
from gpuslice.cli.replay import MAX_SEED, REPLAY_EPILOG, replay
from gpuslice.errors import UserError
from gpuslice.inputs import writable_file
from gpuslice.policies import PLACEMENT
from gpuslice.sim.openb import DEFAULT_TUNE, ReplayResult
from gpuslice.sim.published import FGD_PAPER_POLICIES, published_results
from gpuslice.sim.report import PolicySummary, group_runs, summarize, write_results
from gpuslice.sim.sweep import run_sweep
from gpuslice.sim.trace import DEFAULT_TRACE, OPENB_TRACES

__all__ = ["MAX_JOBS", "MAX_SEED", "MAX_SEEDS", "MAX_TUNE", "app", "openb", "parse_seeds"]

MAX_SEEDS = 10_000  # runs per (trace, policy): a typo such as 0-99999999 is refused, not started
MAX_JOBS = 256  # worker processes; more than any machine this runs on
MAX_TUNE = 10.0  # ten times the cluster's GPU capacity: the paper uses 1.3; pods grow linearly with it

app = typer.Typer(
    help="Replay placement policies on cluster traces (virtual clock, no GPU needed).", no_args_is_help=True
)

# Generated from the registry, so --help never falls behind it. One paragraph per policy: typer keeps
# paragraphs apart in every version, where single line breaks are joined by some.
_POLICIES_EPILOG = "Placement policies:\n\n" + "\n\n".join(
    f"{name}: {cls.summary}" for name, cls in PLACEMENT.items()
)
_SEEDS = re.compile(r"(\d{1,20})-(\d{1,20})|\d{1,20}(,\d{1,20})*", re.ASCII)


def parse_seeds(text: str) -> list[int]:
    """'42-51' (inclusive range), '42,43,50' or '42' → seeds, each 0..MAX_SEED and at most MAX_SEEDS of
    them; UserError names the input otherwise."""
    match = _SEEDS.fullmatch(text.replace(" ", ""))
    if match is None or (match[1] and int(match[1]) > int(match[2])):
        raise UserError(
            f"invalid --seeds {text!r}: use one seed, a range or a list, e.g. 42, 42-51, 42,43,50"
        )
    low, high = (int(match[1]), int(match[2])) if match[1] else (0, 0)
    seeds = [int(s) for s in match[0].split(",")] if not match[1] else []
    if max([high, *seeds]) > MAX_SEED:
        raise UserError(f"invalid --seeds {text!r}: a seed is a whole number from 0 to {MAX_SEED:,}")
    if high - low + 1 > MAX_SEEDS or len(seeds) > MAX_SEEDS:
        raise UserError(f"invalid --seeds {text!r}: at most {MAX_SEEDS:,} seeds per run")
    return seeds or list(range(low, high + 1))


app.command("replay", epilog=REPLAY_EPILOG)(replay)


@app.command(epilog=_POLICIES_EPILOG)
def openb(
    trace: Annotated[
        list[str] | None,
        typer.Option(
            help=f"openb trace, repeatable: {', '.join(OPENB_TRACES)} (all but {DEFAULT_TRACE} from "
            f"--trace-dir). Default: {DEFAULT_TRACE}.",
            show_default=False,
        ),
    ] = None,
    trace_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder of openb CSVs: cluster-trace-gpu-v2023/csv of a clone of alibaba/clusterdata; "
            "default: the bundled data (the default trace only).",
            exists=True,
            file_okay=False,
        ),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Placement policy (list below) or a policy file (.py, see `gpuslice policy check`), "
            f"repeatable. Default: {', '.join(FGD_PAPER_POLICIES)}.",
            show_default=False,
        ),
    ] = None,
    seeds: Annotated[
        str, typer.Option(help=f"Seeds: 42-51, 42,43,50 or 42; at most {MAX_SEEDS:,}, each 0..2^32-1.")
    ] = "42-51",
    jobs: Annotated[int, typer.Option(min=1, max=MAX_JOBS, help=f"Worker processes, 1..{MAX_JOBS}.")] = 1,
    out: Annotated[
        Path,
        typer.Option(
            help="Folder for results.csv, results.json, plots (checked before the run).", callback=writable
        ),
    ] = Path("results"),
    plot: Annotated[bool, typer.Option(help="Also write a PNG plot per trace.")] = False,
    tune: Annotated[
        float,
        typer.Option(
            help=f"Workload, × cluster GPU capacity, 1..{MAX_TUNE:g}.", callback=finite_between(1.0, MAX_TUNE)
        ),
    ] = DEFAULT_TUNE,
    allow_fallbacks: Annotated[
        bool,
        typer.Option(
            "--allow-fallbacks",
            help="Keep the results of a policy that fell back to the default on some decisions (its row "
            "is marked); without it such a run is an error and nothing is written.",
        ),
    ] = False,
) -> None:
    """The FGD paper's openb experiment: unallocated GPU % as the inflated trace arrives, per policy."""
    traces, policies = trace or [DEFAULT_TRACE], policy or list(FGD_PAPER_POLICIES)
    seed_list = parse_seeds(seeds)  # policy and trace names: run_sweep checks them all before any run
    for name in ("results.json", "results.csv"):  # a folder or FIFO there would fail after every run
        writable_file(out / name, "--out")
    console = terminal.console()
    total = len(traces) * len(policies) * len(seed_list)
    # a bar on a terminal; a log gets a line every few seconds on stderr and the table on stdout
    with WorkProgress(console, "sim openb", total, "runs") as progress:
        finished = 0

        def advance(result: ReplayResult) -> None:
            nonlocal finished
            finished += 1
            progress.describe(f"{result.trace} {result.policy} seed {result.seed}")
            progress.update(finished)

        def start() -> None:
            progress.say(
                f"sim openb: {total:,} run{'s' * (total != 1)} ({len(traces)} trace(s) × "
                f"{len(policies)} polic{'ies' if len(policies) != 1 else 'y'} × {len(seed_list)} seed(s)) "
                f"on {jobs} process(es)"
            )

        def interrupted() -> str:
            # Results are written only once every run is done, so an interrupted sweep leaves no file.
            return f"error: interrupted after {finished:,} of {total:,} runs; nothing was written to {out}"

        try:
            with workers_stop_on_interrupt(interrupted):
                results = run_sweep(
                    traces, policies, seed_list, trace_dir, jobs, tune, on_result=advance, on_start=start
                )
        except KeyboardInterrupt:
            terminal.console(stderr=True).print(interrupted(), markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(130) from None
    rows = summarize(results, published_results())
    console.print(_summary_table(rows))
    if any(r.mig is not None for r in results):
        console.print(_mig_table(results))
    _report_fallbacks(rows, allow_fallbacks)
    written = write_results(results, out)
    if plot:
        from gpuslice.sim.plot import write_plots  # matplotlib costs ~0.8 s of start-up; only load it here

        written += write_plots(results, out)
    for path in written:
        console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


def _report_fallbacks(rows: list[PolicySummary], allowed: bool) -> None:
    """A policy that fell back to the default placement is never passed off as itself: stderr says how
    many decisions fell back, and without ``allowed`` that is an error (nothing written, exit 2)."""
    faulty = [row for row in rows if row.fell_back_pods]
    if not faulty:
        return
    what = "; ".join(
        f"{row.policy} on {row.trace}: {row.fell_back_pods:,} of {row.pods:,} decisions" for row in faulty
    )
    if not allowed:
        raise UserError(
            f"policies fell back to the default placement ({what}), so their figures are partly the "
            "default's; fix the policy (`gpuslice policy check FILE`) or pass --allow-fallbacks to keep "
            "them, marked; nothing was written"
        )
    err = terminal.console(stderr=True, highlight=False, soft_wrap=True)
    err.print(f"warning: policies fell back to the default placement: {what}", markup=False)


def _mig_table(results: list[ReplayResult]) -> Table:
    """Per (trace, policy) with MIG-mode GPUs: MIG pods, those that found no instance, slices held."""
    table = Table(
        title="MIG instances (mean over seeds; GPUs in MIG mode are not in the table above)",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        show_edge=False,
    )
    for header in ("trace", "policy", "MIG pods", "no instance", "slices held %"):
        table.add_column(header, justify="left" if header in ("trace", "policy") else "right", no_wrap=True)
    for (trace, policy), runs in group_runs([r for r in results if r.mig is not None]).items():
        migs = [r.mig for r in runs if r.mig is not None]
        held = [100.0 * m["slices_held"] / m["slices"] for m in migs]
        table.add_row(
            trace,
            policy,
            f"{sum(m['pods'] for m in migs) / len(migs):.1f}",
            f"{sum(m['failed_pods'] for m in migs) / len(migs):.1f}",
            f"{sum(held) / len(held):.2f}",
        )
    return table


def _pm(mean: float, sd: float) -> str:
    return f"{mean:.2f} ± {sd:.2f}"


def _summary_table(rows: list[PolicySummary]) -> Table:
    table = Table(
        title="Unallocated GPU % at 100 % arrival (mean ± sd; lower is better)",
        caption="paper: FGD artifact's published runs; diff: ours − paper"
        + ("; *: fell back to the default policy (stderr)" if any(r.fell_back_pods for r in rows) else ""),
        box=box.SIMPLE_HEAD,
        padding=(0, 0),  # gaps of one space (the box's): the eight columns fit in 80 characters
        show_edge=False,
    )
    table.add_column("trace", no_wrap=True)
    table.add_column("policy", no_wrap=True)
    for header in ("runs", "ours", "paper", "diff", "failed", "wall s"):
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        paper, diff = row.published, row.difference_pct
        table.add_row(
            row.trace,
            row.policy + ("*" if row.fell_back_pods else ""),
            str(row.runs),
            _pm(row.unallocated_pct_mean, row.unallocated_pct_sd),
            "—" if paper is None else _pm(paper.mean, paper.sd),
            "—" if diff is None else f"{diff:+.2f}",
            f"{row.failed_pods_mean:.1f}",
            f"{row.wall_seconds_mean:.2f}",
        )
    return table
