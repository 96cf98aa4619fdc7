"""The main job's figure: the part where the policies differ (85–130 % arrival) gets its own zoomed
panel, and every policy its own marker and line style, so no curve hides under another."""

from __future__ import annotations

import numpy as np

from gpuslice.sim.openb import ReplayResult
from gpuslice.sim.plot import ZOOM_PCT, unallocated_figure


def _run(policy: str, final_unallocated_pct: float) -> ReplayResult:
    arrived = np.arange(1, 131) * 10  # milli-GPU of 1 000 in all: 1 % per pod up to 130 %
    allocated = np.minimum(arrived, 1000 - final_unallocated_pct * 10)
    return ReplayResult("default", policy, 42, 1000, arrived, allocated, np.zeros(130), 0, 0.1)


def test_the_figure_has_a_zoomed_panel_and_tells_every_policy_apart():
    policies = ["random", "dotprod", "clustering", "packing", "bestfit", "fgd"]
    runs = [_run(p, 10.0 if p == "packing" else 5.0 + i) for i, p in enumerate(policies)]
    figure = unallocated_figure(runs)
    whole, zoom = figure.axes
    assert whole.get_xlim() == (0.0, 130.0)
    assert zoom.get_xlim() == ZOOM_PCT
    assert zoom.get_ylim()[1] < 20  # zoomed in: the curves' range, not 0-100
    lines = {line.get_label(): line for line in zoom.get_lines()}
    assert set(policies) | {"ideal"} == set(lines)
    styles = {(lines[p].get_marker(), lines[p].get_linestyle()) for p in policies}
    assert len(styles) == len(policies)
    assert lines["ideal"].get_zorder() < min(lines[p].get_zorder() for p in policies)


def test_a_run_tuned_to_130_percent_that_ends_a_pod_short_is_titled_85_to_130():
    arrived = np.arange(1, 130) * 10 + 9  # the last pod lands at 129.9 %: the next would pass 130 %
    run = ReplayResult("default", "fgd", 42, 1000, arrived, np.minimum(arrived, 950), np.zeros(129), 0, 0.1)
    whole, zoom = unallocated_figure([run]).axes
    assert zoom.get_title() == "85–130 % arrival, zoomed"
    assert whole.get_xlim() == (0.0, 130.0)
