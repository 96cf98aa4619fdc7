"""Timed replay plots: GPU allocation, queue length and fragmentation against time, one line per run.

One PNG per (trace, load): three panels sharing the time axis (hours since the first arrival, up to
the time 99 % of the pods have ended), each
run (placement + queue setup, first seed) one line. Drawn on matplotlib's Agg canvas directly (no
pyplot), so it works headless and touches no global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gpuslice.sim.timed_metrics import TimedResult

__all__ = ["timed_figure", "write_timed_plots"]

PLOT_STEM = "replay_over_time"
_LINES = ("-", "--", "-.", ":")


def timed_figure(results: Sequence[TimedResult]) -> Figure:
    """Allocation %, pending pods and fragmentation % against time for runs of one trace at one load."""
    keys = {(r.trace, r.load) for r in results}
    if len(keys) != 1:
        raise ValueError(f"one trace and load per figure, got {sorted(keys)}")
    trace, load = keys.pop()
    figure = Figure(figsize=(11, 8), layout="constrained")
    FigureCanvasAgg(figure)
    allocation, queue, fragmentation = figure.subplots(3, 1, sharex=True)
    seen: set[tuple[str, str]] = set()
    for k, run in enumerate(results):
        if (run.placement, run.queue) in seen:
            continue  # first seed only: the lines are for comparing setups
        seen.add((run.placement, run.queue))
        origin = float(run.arrival.min()) if len(run.arrival) else 0.0
        style = {"linestyle": _LINES[k % len(_LINES)], "lw": 1.1, "label": f"{run.placement} / {run.queue}"}
        hours = (run.sample_time - origin) / 3600.0
        allocation.step(hours, run.allocation_pct, where="post", **style)
        queue.step(hours, run.pending, where="post", **style)
        fragmentation.plot((run.fragmentation_time - origin) / 3600.0, run.fragmentation_pct, **style)
    ends = [
        float(np.nanpercentile(r.end, 99)) - float(r.arrival.min())
        for r in results
        if (~np.isnan(r.end)).any()
    ]
    if ends:  # the busy part: month-long pods would otherwise squeeze it into the left edge
        fragmentation.set_xlim(0, max(ends) / 3600.0)
    allocation.set_ylabel("GPU allocated (% of cluster)")
    allocation.set_ylim(0, 100)
    queue.set_ylabel("pods waiting")
    fragmentation.set_ylabel("fragmented GPU (% of cluster)")
    fragmentation.set_xlabel("hours since the first arrival")
    for axes in (allocation, queue, fragmentation):
        axes.grid(alpha=0.3)
    allocation.legend(loc="upper right", fontsize="small", ncols=2)
    figure.suptitle(f"openb {trace}, arrivals compressed {load:g}×: allocation, queue and fragmentation")
    return figure


def write_timed_plots(results: Sequence[TimedResult], out_dir: Path) -> list[Path]:
    """One PNG per (trace, load) in ``out_dir``: ``replay_over_time_<trace>_load<load>.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, float], list[TimedResult]] = {}
    for result in results:
        groups.setdefault((result.trace, result.load), []).append(result)
    paths = []
    for (trace, load), runs in groups.items():
        path = out_dir / f"{PLOT_STEM}_{trace}_load{load:g}.png"
        timed_figure(runs).savefig(path, dpi=110)
        paths.append(path)
    return paths
