"""``gpuslice tune``: search placement weights and queue settings through the timed replay (Optuna);
score the best on held-out traces; write it as a placement policy file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.cli.interrupt import workers_stop_on_interrupt
from gpuslice.cli.progress import WorkProgress
from gpuslice.cli.replay import MAX_NODE_STRIDE, MAX_SEED, check_load
from gpuslice.errors import UserError
from gpuslice.inputs import InvalidInput, bounded_int, writable_file
from gpuslice.sim.trace import DEFAULT_TRACE
from gpuslice.sim.tune import DEFAULTS, OBJECTIVES, TuneSetup, check_disjoint, tuning_trace, write_policy
from gpuslice.sim.tune_study import run_study

__all__ = ["tune"]

MAX_JOBS = 64
MAX_TRIALS = 10_000  # a trial replays every training window: 10,000 is days of work already
MAX_HOLDOUT_SEEDS = 32


# The first bytes of every SQLite 3 database file (https://www.sqlite.org/fileformat.html).
_SQLITE_HEADER = b"SQLite format 3\0"


def _study_file(path: Path) -> Path:
    """``--study``: absent, empty (sqlite makes it a database) or an SQLite database; its folder writable.
    Anything else would reach Optuna as a storage error after the traces are loaded."""
    writable_file(path, "--study")
    if path.exists():
        with path.open("rb") as handle:
            head = handle.read(len(_SQLITE_HEADER))
        if head and head != _SQLITE_HEADER:
            raise InvalidInput(
                f"--study {path} is not an SQLite database: give a study file an earlier run wrote, "
                "or a new file name"
            )
    return path


def tune(
    objective: Annotated[str, typer.Option(help=f"What to minimise: {', '.join(OBJECTIVES)}.")] = "mean-jct",
    train: Annotated[
        list[str] | None,
        typer.Option(
            help="Training trace window NAME@K (jobs K·N..(K+1)·N of NAME), repeatable. "
            f"Default: {DEFAULT_TRACE}@1.",
            show_default=False,
        ),
    ] = None,
    holdout: Annotated[
        list[str] | None,
        typer.Option(
            help="Held-out trace window, never seen by the search (one that overlaps a --train window is "
            f"refused; a bare NAME counts as all its windows), repeatable. Default: {DEFAULT_TRACE}@2.",
            show_default=False,
        ),
    ] = None,
    trace_dir: Annotated[
        Path | None,
        typer.Option(help="Folder of openb CSVs; default: the bundled data.", exists=True, file_okay=False),
    ] = None,
    sample: Annotated[int, typer.Option(help="Jobs per trace window (N).")] = 800,
    node_stride: Annotated[
        int, typer.Option(help=f"Keep every K-th node of the cluster, 1..{MAX_NODE_STRIDE:,}.")
    ] = 20,
    load: Annotated[float, typer.Option(help="Arrival compression: arrivals at creation_time / LOAD.")] = 1e4,
    trials: Annotated[
        int, typer.Option(help=f"Trials to add to the study in this run, 1..{MAX_TRIALS:,}.")
    ] = 20,
    jobs: Annotated[int, typer.Option(help="Trials run in parallel (processes).")] = 1,
    seed: Annotated[int, typer.Option(help=f"Seed of the sampler (TPE), 0..{MAX_SEED:,}.")] = 0,
    holdout_seeds: Annotated[
        int,
        typer.Option(
            help=f"Seeds per held-out window, 1..{MAX_HOLDOUT_SEEDS}: the best and the defaults are "
            "replayed on each (window, seed) pair (seed k: replay seed 42+k and, for k ≥ 1, a random "
            "tenth of the window's pods left out); the result gives mean, sd and min–max over the pairs "
            "and says whether the paired difference is beyond noise (every pair the same sign and the "
            "mean difference over 2 standard errors; needs 3 pairs or more)."
        ),
    ] = 3,
    study: Annotated[
        Path | None,
        typer.Option(help="Optuna sqlite file: a second run continues the study. Default: a temporary one."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Where to write the best parameters as a policy file.")] = Path(
        "tuned_policy.py"
    ),
) -> None:
    """Search the tuned-fit placement policy's weights (CPU and GPU leftover, shared-GPU bonus), EASY
    backfill on/off and the queue's aging period through the timed replay with Optuna (TPE) on training
    traces; replay the best and the defaults on held-out traces; write the best as a placement policy file
    (`sim openb --policy FILE`, `serve --placement FILE`, `k8s extender --policy FILE`). Queue settings
    (backfill, aging) are printed, written to FILE.json and as a comment at the top of FILE."""
    if objective not in OBJECTIVES:
        raise UserError(f"--objective {objective!r}: must be one of {', '.join(OBJECTIVES)}")
    check_load(load)
    if sample < 2:
        raise UserError(f"--sample {sample}: must be at least 2")
    bounded_int(trials, "--trials", 1, MAX_TRIALS)
    bounded_int(node_stride, "--node-stride", 1, MAX_NODE_STRIDE)
    bounded_int(seed, "--seed", 0, MAX_SEED)
    if not 1 <= jobs <= MAX_JOBS:
        raise UserError(f"--jobs {jobs}: must be between 1 and {MAX_JOBS}")
    if not 1 <= holdout_seeds <= MAX_HOLDOUT_SEEDS:
        raise UserError(f"--holdout-seeds {holdout_seeds}: must be between 1 and {MAX_HOLDOUT_SEEDS}")
    writable_file(out, "--out")
    if study is not None:
        _study_file(study)
    train_specs = train or [f"{DEFAULT_TRACE}@1"]
    holdout_specs = holdout or [f"{DEFAULT_TRACE}@2"]
    train_traces = [tuning_trace(s, sample, node_stride, trace_dir) for s in train_specs]
    holdout_traces = [tuning_trace(s, sample, node_stride, trace_dir) for s in holdout_specs]
    check_disjoint(train_specs, holdout_specs)  # each window checked above; now that none is trained on
    setup = TuneSetup(objective, load)
    attrs = {
        "objective": objective,
        "load": load,
        "train": train_specs,
        "sample": sample,
        "node_stride": node_stride,
    }
    # Both folders were probed above; they are made only now that every input is known to be good.
    for path in (out, study):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    console = terminal.console()
    with WorkProgress(console, f"tune ({objective})", trials, "trials") as progress:
        progress.say(f"tune: {trials:,} trials on {len(train_traces)} training window(s), {jobs} process(es)")
        finished = 0

        def advance() -> None:
            nonlocal finished
            finished += 1
            progress.update(finished)

        def interrupted() -> str:
            # The policy file and its record are written only once the run is done: none is left half
            # written. The study keeps every trial told to it (each is one transaction of sqlite).
            when = (
                "in the held-out replay" if finished == trials else f"after {finished:,} of {trials:,} trials"
            )
            kept = (
                f"kept {study} with the trials that finished (run again with --study {study} to continue)"
                if study is not None
                else "kept nothing (the study was a temporary one; --study FILE keeps it)"
            )
            return f"error: interrupted {when}; {kept}; nothing was written to {out}"

        try:
            with workers_stop_on_interrupt(interrupted):
                run = run_study(
                    setup=setup,
                    train=train_traces,
                    holdout=holdout_traces,
                    holdout_names=holdout_specs,
                    attrs=attrs,
                    seed=seed,
                    trials=trials,
                    jobs=jobs,
                    study=study,
                    holdout_seeds=holdout_seeds,
                    on_trial=advance,
                    on_phase=progress.describe,
                )
        except KeyboardInterrupt:
            terminal.console(stderr=True).print(interrupted(), markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(130) from None
    write_policy(run.best, out)
    meta = out.with_name(out.name + ".json")
    meta.write_text(json.dumps(run.summary, indent=2) + "\n")
    meta.chmod(0o600)
    console.print(_table(run.best, run.summary))
    for line in (f"held-out: {run.summary['holdout_verdict']}", f"wrote {out}", f"wrote {meta}"):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _table(best: dict[str, Any], summary: dict[str, Any]) -> Table:
    objective = summary["objective"]
    table = Table(title=f"tune: held-out {objective} (lower is better)", box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("parameter")
    table.add_column("defaults", justify="right")
    table.add_column("best", justify="right")
    for key in DEFAULTS:
        table.add_row(key, _fmt(DEFAULTS[key]), _fmt(best[key]))
    seeds = len(summary["holdout_seeds"])
    for w in summary["holdout_windows"]:
        gain = "—" if w["improvement_pct"] is None else f"{w['improvement_pct']:+.2f} %"
        table.add_row(f"{objective}, {w['window']}", _fmt(w["defaults"]), f"{_fmt(w['best'])} ({gain})")
    spread = summary["holdout_spread"]
    runs = f"{len(summary['holdout_windows'])} window(s) × {seeds} seed(s)"
    table.add_row(
        f"held-out {objective}, mean", _fmt(summary["holdout_defaults"]), _fmt(summary["holdout_best"])
    )
    for stat, label in (("sd", f"sd over {runs}"), ("min", "min"), ("max", "max")):
        table.add_row(label, _fmt(spread["defaults"][stat]), _fmt(spread["best"][stat]))
    gain = summary["holdout_improvement_pct"]
    table.add_row("improvement", "", "—" if gain is None else f"{gain:+.2f} %")
    diff = spread["difference"]
    table.add_row(f"defaults − best, n {spread['n']}", "", f"{_fmt(diff['mean'])} ± {_fmt(diff['sd'])}")
    return table


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:,.3f}" if isinstance(value, float) else str(value)
