"""Cost profiles: a JSON file that replaces the cost model's three numbers, validated field by field."""

from __future__ import annotations

import json

import pytest

from gpuslice.memory import SimConfig, make_workload, simulate
from gpuslice.memory.cost import CostModel, CostProfileError, load_cost_profile
from gpuslice.programs.loader import memory_ops

GOOD = {
    "format": 1,
    "name": "test-profile",
    "link_bytes_per_s": 25e9,
    "batch_overhead_s": 40e-6,
    "per_access_s": 1e-9,
    "source": {"measured": False, "note": "hand-written for a test"},
}


def write(tmp_path, data, name="profile.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_a_valid_profile_sets_all_three_numbers_and_its_name(tmp_path):
    cost = load_cost_profile(write(tmp_path, GOOD))
    assert cost.link_bytes_per_s == 25e9
    assert cost.batch_overhead_s == 40e-6 and cost.per_access_s == 1e-9
    assert cost.name == "test-profile"
    assert cost.batch_seconds(25_000) == pytest.approx(40e-6 + 1e-6)


def test_without_a_name_the_file_stem_names_the_profile(tmp_path):
    data = {k: v for k, v in GOOD.items() if k != "name"}
    assert load_cost_profile(write(tmp_path, data, "h200-pcie5.json")).name == "h200-pcie5"


def test_a_profile_changes_the_simulated_time_as_its_numbers_say(tmp_path):
    trace = make_workload("seq-stream", scale=0.05)
    ops = memory_ops("default", "tree")
    slow = load_cost_profile(write(tmp_path, {**GOOD, "batch_overhead_s": 1e-3}))
    fast = load_cost_profile(write(tmp_path, {**GOOD, "batch_overhead_s": 0.0}, "fast.json"))
    a = simulate(trace, ops, SimConfig(oversub=1.5, cost=slow), "default", "tree")
    b = simulate(trace, ops, SimConfig(oversub=1.5, cost=fast), "default", "tree")
    # batching depends on the clock (per-stream progress), so only the price per batch is compared
    assert a.batches > 0 and a.estimated_seconds >= a.batches * 1e-3
    assert b.estimated_seconds < a.estimated_seconds


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param("{not json", "is not JSON (line 1, column 2", id="not json"),
        pytest.param([1, 2], "expected a JSON object, got list", id="a list"),
        pytest.param({**GOOD, "format": 2}, "'format' must be 1, got 2", id="wrong format"),
        pytest.param({k: v for k, v in GOOD.items() if k != "format"}, "'format' must be 1", id="no format"),
        pytest.param(
            {k: v for k, v in GOOD.items() if k != "per_access_s"},
            "missing field 'per_access_s'",
            id="missing",
        ),
        pytest.param({**GOOD, "link_bytes_per_s": 0}, "link_bytes_per_s must be > 0", id="zero link"),
        pytest.param({**GOOD, "batch_overhead_s": -1e-6}, "batch_overhead_s must be >= 0", id="negative"),
        pytest.param({**GOOD, "per_access_s": "1ns"}, "per_access_s must be a finite number", id="text"),
        pytest.param({**GOOD, "per_access_s": True}, "per_access_s must be a finite number", id="bool"),
        pytest.param('{"format": 1, "link_bytes_per_s": NaN}', "must be a finite number", id="nan"),
        pytest.param({**GOOD, "batch_overhead": 1e-6}, "unknown field 'batch_overhead'", id="typo"),
        pytest.param({**GOOD, "name": 7}, "name must be text", id="name"),
        pytest.param({**GOOD, "source": "lab"}, "source must be a JSON object", id="source"),
        pytest.param(
            '{"format": 1, "source": ' + "[" * 10_000 + "]" * 10_000 + "}",
            "nests too deeply",
            id="10,000 deep",
        ),
        pytest.param(
            '{"format": 1, "per_access_s": ' + "9" * 5000 + "}", "thousands of digits", id="5,000 digits"
        ),
    ],
)
def test_a_bad_profile_is_one_clear_user_error(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(CostProfileError) as raised:
        load_cost_profile(path)
    assert message in str(raised.value) and str(path) in str(raised.value)


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(CostProfileError, match=r"cannot read cost profile .*No such file"):
        load_cost_profile(tmp_path / "nope.json")


def test_an_unknown_link_name_is_refused_unless_a_rate_is_given():
    with pytest.raises(ValueError, match="unknown link 'pcie9'"):
        CostModel(link="pcie9")
    assert CostModel(link="measured", bytes_per_s=1e9).link_bytes_per_s == 1e9


def test_memsim_cost_profile_is_used_and_named_in_the_table(tmp_path, run_cli):
    path = write(tmp_path, GOOD)
    args = ["memsim", "--workload", "seq-stream", "--scale", "0.05", "--cost-profile", str(path)]
    code, out, err = run_cli(args)
    assert code in (0, None), err
    assert "costs: test-profile" in out


def test_memsim_with_a_bad_profile_prints_one_error_line_and_exits_2(tmp_path, run_cli):
    path = write(tmp_path, {**GOOD, "link_bytes_per_s": -5})
    code, _out, err = run_cli(["memsim", "--cost-profile", str(path)])
    assert code == 2
    assert err.strip().splitlines() == [f"error: cost profile {path}: link_bytes_per_s must be > 0, got -5"]
