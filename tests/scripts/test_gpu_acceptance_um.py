"""The unified-memory side of the acceptance script without a GPU: the plan, the sweep traces that
mirror the worker's kernel, the worker's output parsed, and the cost profile built from it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from acceptance_helpers import canned_worker_output

from gpu_acceptance import um
from gpuslice.memory import SimConfig, simulate
from gpuslice.memory.cost import CostModel, load_cost_profile
from gpuslice.programs.loader import memory_ops

MIB = 1 << 20


def small_plan(**kw):
    return um.make_plan(capacity_bytes=16 * MIB, bench_bytes=8 * MIB, fault_pages=32, streams=16, **kw)


def test_by_default_no_sweep_oversubscribes_the_free_memory():
    plan = small_plan()
    assert plan["allow_oversubscription"] is False
    sizes = [s["streams"] * s["tile"] * 4096 for s in plan["sweeps"]]
    assert max(sizes) <= um.SAFE_RATIO * plan["capacity_bytes"]
    assert {s["pattern"] for s in plan["sweeps"]} == {"cyclic", "random"}


def test_with_oversubscription_allowed_the_sweeps_reach_twice_the_capacity():
    plan = small_plan(allow_oversubscription=True)
    assert sorted({s["ratio"] for s in plan["sweeps"]}) == [1.0, 1.25, 1.5, 1.75, 2.0]
    assert max(s["streams"] * s["tile"] * 4096 for s in plan["sweeps"]) == 32 * MIB


@pytest.mark.parametrize("pattern", ["cyclic", "random"])
def test_every_pass_of_a_sweep_trace_visits_each_page_once(pattern):
    plan = small_plan(allow_oversubscription=True)
    for sweep in (s for s in plan["sweeps"] if s["pattern"] == pattern):
        trace = um.sweep_trace(sweep)
        pages = trace.block.astype(np.int64) * 512 + trace.page
        per_pass = sweep["streams"] * sweep["tile"]
        assert len(trace) == per_pass * len(sweep["passes"])
        for p in range(len(sweep["passes"])):
            chunk = pages[p * per_pass : (p + 1) * per_pass]
            assert np.array_equal(np.sort(chunk), np.arange(per_pass))
        # thread s stays inside its own tile, one page per step
        assert np.array_equal(pages[: sweep["streams"]] // sweep["tile"], np.arange(sweep["streams"]))
        if pattern == "cyclic":
            assert np.array_equal(pages[:: sweep["streams"]][: sweep["tile"]], np.arange(sweep["tile"]))


def test_random_passes_use_different_permutations():
    sweep = next(s for s in small_plan()["sweeps"] if s["pattern"] == "random" and s["tile"] > 8)
    assert sweep["passes"][0] != sweep["passes"][1]


def test_worker_output_is_parsed_by_kind_and_other_lines_kept_as_notes():
    plan = small_plan()
    m = um.parse_measurements(
        canned_worker_output(plan) + '{"kind": "error", "step": "advise", "message": "x"}\n'
    )
    assert m.faults["pages"] == 32 and len(m.sweeps) == len(plan["sweeps"])
    assert set(m.bandwidth) == {("h2d", "fault"), ("d2h", "fault"), ("h2d", "prefetch"), ("d2h", "prefetch")}
    assert m.notes == ["CuPy warning: a line that is not JSON is kept as a note"]
    assert m.errors == [{"kind": "error", "step": "advise", "message": "x"}]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param({"kind": "faults", "pages": 3}, "faults record lacks seconds", id="missing"),
        pytest.param(
            {"kind": "faults", "pages": 3, "seconds": -1}, "seconds must be positive", id="negative"
        ),
        pytest.param(
            {"kind": "resident", "accesses": 3, "seconds": "1"}, "seconds must be positive", id="text"
        ),
        pytest.param(
            {
                "kind": "sweep",
                "pattern": "cyclic",
                "ratio": 1,
                "tile": 2,
                "streams": 2,
                "buffer_bytes": 1,
                "capacity_bytes": 1,
                "pass_seconds": [],
            },
            "pass_seconds",
            id="no passes",
        ),
    ],
)
def test_a_malformed_measurement_is_refused(line, message):
    with pytest.raises(um.MeasurementError, match=message):
        um.parse_measurements(json.dumps(line))


def test_profile_from_canned_figures_loads_and_reproduces_the_serial_fault_time(tmp_path):
    m = um.parse_measurements(canned_worker_output(small_plan()))
    profile = um.build_cost_profile(m, name="canned", source={"measured": False})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    cost = load_cost_profile(path)
    assert cost.link_bytes_per_s == pytest.approx(25e9)
    assert cost.per_access_s == pytest.approx(1e-9)
    assert profile["source"]["measured"] is False
    # memsim replaying the serial-fault kernel with this profile gives the measured 40 µs per fault
    sim = simulate(
        um.serial_fault_trace(32),
        memory_ops("default", "tree"),
        SimConfig(
            oversub=1.0,
            cost=CostModel(
                link="x",
                bytes_per_s=cost.link_bytes_per_s,
                batch_overhead_s=cost.batch_overhead_s,
                per_access_s=0.0,
            ),
        ),
        "default",
        "tree",
    )
    assert sim.batches == 32
    assert sim.estimated_seconds / 32 == pytest.approx(40e-6, rel=1e-6)
    assert 0 < cost.batch_overhead_s < 40e-6


def test_a_profile_needs_the_three_measurements_and_says_which_it_has():
    m = um.parse_measurements(canned_worker_output(small_plan(), drop=("resident",)))
    with pytest.raises(um.MeasurementError, match="have: faults, bandwidth h2d fault"):
        um.build_cost_profile(m, name="x", source={})


def test_memsim_capacity_matches_the_measured_free_memory():
    assert um.memsim_oversub(trace_blocks=16, capacity_bytes=8 * 2 * MIB) == 2.0
    assert um.memsim_oversub(trace_blocks=4, capacity_bytes=16 * MIB) == 1.0  # fits: no eviction
    from gpuslice.memory.simulator import capacity_for

    sweep = next(s for s in small_plan(allow_oversubscription=True)["sweeps"] if s["ratio"] == 1.5)
    trace = um.sweep_trace(sweep)
    oversub = um.memsim_oversub(trace.working_set_blocks, 16 * MIB)
    assert capacity_for(trace, float(f"{oversub:.9f}")) == 8  # 16 MiB = 8 chunks of 2 MB


def test_compare_sweeps_reports_the_relative_error():
    measured = [
        {"pattern": "cyclic", "ratio": 1.5, "buffer_bytes": 3, "capacity_bytes": 2, "pass_seconds": [1, 1]},
        {"pattern": "random", "ratio": 1.5, "buffer_bytes": 3, "capacity_bytes": 2, "pass_seconds": [2]},
    ]
    rows = um.compare_sweeps(measured, {("cyclic", 1.5): 2.5})
    assert rows[0]["error"] == pytest.approx(0.25) and rows[0]["oversub"] == 1.5
    assert rows[1]["memsim_s"] is None and rows[1]["error"] is None


def test_a_measured_sweep_is_matched_to_its_plan_and_a_different_shape_is_refused():
    plan = small_plan()
    m = um.parse_measurements(canned_worker_output(plan))
    measured = m.sweeps[3]
    assert um.planned_sweep(plan["sweeps"], measured)["passes"] == plan["sweeps"][3]["passes"]
    with pytest.raises(um.MeasurementError, match="differ from the plan"):
        um.planned_sweep(plan["sweeps"], {**measured, "tile": measured["tile"] + 1})
    with pytest.raises(um.MeasurementError, match="differ from the plan"):
        um.planned_sweep(plan["sweeps"], {**measured, "pass_seconds": [1.0]})
    with pytest.raises(um.MeasurementError, match="not in the plan"):
        um.planned_sweep(plan["sweeps"], {**measured, "ratio": 3.0})
