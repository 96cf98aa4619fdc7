"""The FGD paper's Fig. 9a for our runs: unallocated GPU % against arrived workload %, one line per policy.

Each run's curve is interpolated onto whole arrival percents, then averaged over seeds. The dashed
"ideal" line is what a scheduler that never fragments would leave unallocated: max(100 − arrived, 0).
Drawn with matplotlib's Agg canvas directly (no pyplot), so it works headless and touches no global state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gpuslice.sim.openb import ReplayResult
from gpuslice.sim.report import group_runs

__all__ = [
    "ZOOM_PCT",
    "mean_unallocated_curve",
    "plot_unallocated_vs_arrival",
    "unallocated_figure",
    "write_plots",
]

PLOT_STEM = "unallocated_vs_arrival"


def mean_unallocated_curve(runs: Sequence[ReplayResult], grid_pct: np.ndarray) -> np.ndarray:
    """Unallocated GPU % at each arrival % of ``grid_pct``, averaged over ``runs``.

    A run starts at (0 % arrived, 100 % unallocated); past its last pod it holds its final value.
    CPU-only pods repeat an arrival value; np.interp takes one of the equal points, which is fine at
    this resolution."""
    curves = [np.interp(grid_pct, np.r_[0.0, r.arrived_pct], np.r_[100.0, r.unallocated_pct]) for r in runs]
    return np.mean(curves, axis=0)


ZOOM_PCT = (85.0, 130.0)  # where the policies part: before 85 % arrival every curve sits on the ideal line
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
_LINES = ("-", "--", "-.", ":")


def plot_unallocated_vs_arrival(results: Sequence[ReplayResult], path: Path) -> Path:
    """Plot one trace's runs (all policies) into the PNG ``path`` (see ``unallocated_figure``)."""
    unallocated_figure(results).savefig(path, dpi=120)
    return path


def unallocated_figure(results: Sequence[ReplayResult]) -> Figure:
    """One trace's runs (all policies): the whole arrival range on the left, and on the right the part
    where the policies differ (85–130 % arrival), zoomed, each policy with its own marker and line style
    so that curves lying on top of each other stay apart; the ideal line is thin and grey, behind."""
    traces = {r.trace for r in results}
    if len(traces) != 1:
        raise ValueError(f"one trace per figure, got {sorted(traces)}")
    # Rounded up: a trace tuned to 130 % ends a pod short of it (129.9 %), and the axis and the title
    # should say the 130 % the run was tuned to, as the README does.
    top_pct = math.ceil(max(r.arrived_pct[-1] for r in results))
    grid_pct = np.arange(0, top_pct + 1, dtype=float)
    seeds = len({r.seed for r in results})
    curves = {
        policy: mean_unallocated_curve(runs, grid_pct) for (_, policy), runs in group_runs(results).items()
    }
    ideal = np.maximum(100.0 - grid_pct, 0.0)

    figure = Figure(figsize=(12, 5.5), layout="constrained")
    FigureCanvasAgg(figure)
    whole, zoom = figure.subplots(1, 2, width_ratios=(1, 1.5))
    low, high = ZOOM_PCT[0], min(ZOOM_PCT[1], grid_pct[-1])
    inside = (grid_pct >= low) & (grid_pct <= high)
    for k, (policy, curve) in enumerate(curves.items()):
        style = {"marker": _MARKERS[k % len(_MARKERS)], "linestyle": _LINES[k % len(_LINES)], "label": policy}
        whole.plot(grid_pct, curve, markevery=10, markersize=4, lw=1.2, **style)
        zoom.plot(grid_pct[inside], curve[inside], markevery=5, markersize=6, lw=1.6, **style)
    for axes in (whole, zoom):
        axes.plot(grid_pct, ideal, color="0.6", lw=1, ls=(0, (4, 3)), zorder=0, label="ideal")
        axes.grid(alpha=0.3)
        axes.set_xlabel("arrived workload (% of cluster GPU capacity)")
    whole.axvspan(low, high, color="0.92", zorder=-1)
    whole.set_xlim(0, grid_pct[-1])
    whole.set_ylim(0, 100)
    whole.set_ylabel("unallocated GPU (% of cluster GPU capacity)")
    whole.set_title("whole run (shaded: the zoomed part)")
    top = max(float(c[inside].max()) for c in curves.values()) if inside.any() else 100.0
    zoom.set_xlim(low, high)
    zoom.set_ylim(0, top * 1.08 + 0.5)
    zoom.set_title(f"{low:.0f}–{high:.0f} % arrival, zoomed")
    zoom.legend(loc="upper right", ncols=2, fontsize="small")
    runs_text = f"mean of {seeds} seeds" if seeds > 1 else "one seed"
    figure.suptitle(f"openb {traces.pop()}: unallocated GPU vs arrived workload ({runs_text})")
    return figure


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
