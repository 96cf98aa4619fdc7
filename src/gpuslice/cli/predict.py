"""``gpuslice predict``: train the duration model on the earlier part of a trace, judge it on the rest."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.cli.options import writable
from gpuslice.cli.progress import WorkProgress, read_timed_trace
from gpuslice.cli.replay import MAX_SEED
from gpuslice.errors import UserError
from gpuslice.inputs import bounded_int, writable_file
from gpuslice.sim.trace import DEFAULT_TRACE

__all__ = ["predict"]

_OUTPUTS = ("errors.json", "predictions.csv")


def predict(
    trace: Annotated[str, typer.Option(help="openb trace with timestamps.")] = DEFAULT_TRACE,
    trace_dir: Annotated[
        Path | None,
        typer.Option(help="Folder of openb CSVs; default: the bundled data.", exists=True, file_okay=False),
    ] = None,
    train_fraction: Annotated[
        float, typer.Option(help="Share of the pods, earliest first, to train on; the rest is held out.")
    ] = 0.7,
    seed: Annotated[int, typer.Option(help=f"Seed of the model, 0..{MAX_SEED:,}.")] = 0,
    out: Annotated[
        Path, typer.Option(help="Folder for errors.json and predictions.csv.", callback=writable)
    ] = Path("results"),
) -> None:
    """Predict pods' run times (scikit-learn gradient boosting on CPU, memory, GPUs, GPU models, QoS,
    arrival hour and weekday) and show its error on held-out pods against a constant guess."""
    bounded_int(seed, "--seed", 0, MAX_SEED)  # scikit-learn's random_state is 32-bit
    if not 0 < train_fraction < 1:
        raise UserError(f"--train-fraction {train_fraction:g}: must be between 0 and 1 (exclusive)")
    for name in _OUTPUTS:  # a folder or FIFO in a result's place would fail only after the training
        writable_file(out / name, "--out")
    from gpuslice.sim.duration_model import held_out_errors  # scikit-learn: ~1 s to import

    console = terminal.console()
    timed = read_timed_trace(console, trace, trace_dir)
    with WorkProgress(console, "predict", len(timed.jobs), "pods") as progress:
        progress.say(
            f"predict: {len(timed.jobs):,} pods of {trace}, the first {train_fraction:.0%} to train on"
        )
        try:
            with progress.waiting("training the model and judging it"):
                errors, judged, predicted = held_out_errors(timed.jobs, train_fraction, seed)
        except ValueError as e:
            raise UserError(f"--train-fraction {train_fraction:g} on {trace}: {e}") from None
    table = Table(
        title=f"Run-time prediction on {trace}: held-out error", box=box.SIMPLE_HEAD, show_edge=False
    )
    for header in ("", "model", "median guess"):
        table.add_column(header, justify="right")
    table.add_row("mean abs error (s)", f"{errors.mae_s:,.0f}", f"{errors.baseline_mae_s:,.0f}")
    table.add_row("median abs error (s)", f"{errors.median_ae_s:,.0f}", f"{errors.baseline_median_ae_s:,.0f}")
    table.add_row("mean |log ratio|", f"{errors.log_mae:.2f}", f"{errors.baseline_log_mae:.2f}")
    table.add_row("rank correlation", f"{errors.rank_correlation:.3f}", "—")
    console.print(table)
    console.print(f"trained on {errors.train_pods} pods, judged on {errors.test_pods} later ones")
    out.mkdir(parents=True, exist_ok=True)
    (out / "errors.json").write_text(json.dumps({"trace": trace, **errors.record()}, indent=1) + "\n")
    with (out / "predictions.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("name", "qos", "duration_s", "predicted_s"))
        for job, guess in zip(judged, predicted.tolist(), strict=True):
            writer.writerow((job.name, job.qos, job.duration, round(guess, 1)))
    for name in _OUTPUTS:
        console.print(f"wrote {out / name}", markup=False, highlight=False, soft_wrap=True)
