"""The FGD paper's Fig. 9a for our runs: unallocated GPU % against arrived workload %, one line per policy.

Each run's curve is interpolated onto whole arrival percents, then averaged over seeds. The dashed
"ideal" line is what a scheduler that never fragments would leave unallocated: max(100 − arrived, 0).
Drawn with matplotlib's Agg canvas directly (no pyplot), so it works headless and touches no global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gpuslice.sim.openb import ReplayResult
from gpuslice.sim.report import group_runs

__all__ = ["mean_unallocated_curve", "plot_unallocated_vs_arrival", "write_plots"]

PLOT_STEM = "unallocated_vs_arrival"


def mean_unallocated_curve(runs: Sequence[ReplayResult], grid_pct: np.ndarray) -> np.ndarray:
    """Unallocated GPU % at each arrival % of ``grid_pct``, averaged over ``runs``.

    A run starts at (0 % arrived, 100 % unallocated); past its last pod it holds its final value.
    CPU-only pods repeat an arrival value; np.interp takes one of the equal points, which is fine at
    this resolution."""
    curves = [np.interp(grid_pct, np.r_[0.0, r.arrived_pct], np.r_[100.0, r.unallocated_pct]) for r in runs]
    return np.mean(curves, axis=0)


def plot_unallocated_vs_arrival(results: Sequence[ReplayResult], path: Path) -> Path:
    """Plot one trace's runs (all policies) into the PNG ``path``."""
    traces = {r.trace for r in results}
    if len(traces) != 1:
        raise ValueError(f"one trace per figure, got {sorted(traces)}")
    top_pct = int(max(r.arrived_pct[-1] for r in results))
    grid_pct = np.arange(0, top_pct + 1, dtype=float)
    seeds = len({r.seed for r in results})

    figure = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for (_, policy), runs in group_runs(results).items():
        axes.plot(grid_pct, mean_unallocated_curve(runs, grid_pct), label=policy)
    axes.plot(grid_pct, np.maximum(100.0 - grid_pct, 0.0), "k--", label="ideal")
    axes.set_title(f"openb {traces.pop()}: unallocated GPU vs arrived workload (mean of {seeds} seeds)")
    axes.set_xlabel("arrived workload (% of cluster GPU capacity)")
    axes.set_ylabel("unallocated GPU (% of cluster GPU capacity)")
    axes.set_xlim(0, grid_pct[-1])
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)
    return path


def write_plots(results: Sequence[ReplayResult], out_dir: Path) -> list[Path]:
    """One PNG per trace in ``out_dir``: ``unallocated_vs_arrival.png``, or ``…_<trace>.png`` for several."""
    out_dir.mkdir(parents=True, exist_ok=True)
    by_trace: dict[str, list[ReplayResult]] = {}
    for result in results:
        by_trace.setdefault(result.trace, []).append(result)
    if len(by_trace) == 1:
        return [plot_unallocated_vs_arrival(results, out_dir / f"{PLOT_STEM}.png")]
    return [
        plot_unallocated_vs_arrival(runs, out_dir / f"{PLOT_STEM}_{trace}.png")
        for trace, runs in by_trace.items()
    ]
