"""``gpuslice sim openb`` through the console script: bad input fails first; a run writes files."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from gpuslice.cli.main import main
from gpuslice.cli.sim import parse_seeds
from gpuslice.errors import UserError
from gpuslice.policies import PLACEMENT
from gpuslice.sim.published import published_results


def run_cli(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Run ``gpuslice ARGS`` as the console script does; return (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["gpuslice", *args])
    monkeypatch.setenv("COLUMNS", "200")  # rich help and tables: no wrapping inside names
    with pytest.raises(SystemExit) as stopped:
        main()
    captured = capsys.readouterr()
    return stopped.value.code, captured.out, captured.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--policy", "fdg"], "error: 'fdg' is not a placement policy; known: ", id="unknown policy"
        ),
        pytest.param(["--trace", "nope"], "error: no trace 'nope'", id="unknown trace"),
        pytest.param(["--seeds", "42-"], "error: invalid --seeds '42-'", id="bad seeds"),
        pytest.param(["--seeds", "51-42"], "error: invalid --seeds '51-42'", id="reversed seed range"),
        pytest.param(
            ["--out", "pyproject.toml"], "error: --out pyproject.toml is a file", id="out is a file"
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(args, message, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    Path("pyproject.toml").write_text("")
    code, out, err = run_cli(["sim", "openb", *args], monkeypatch, capsys)
    assert code == 2
    assert err.startswith(message), err
    assert err.count("\n") == 1, err
    assert out == ""
    assert not Path("results").exists()


def test_unknown_policy_message_names_every_known_policy(monkeypatch, capsys):
    _, _, err = run_cli(["sim", "openb", "--policy", "fgd", "--policy", "fdg"], monkeypatch, capsys)
    assert all(name in err for name in PLACEMENT)


def test_jobs_below_one_is_a_usage_error(monkeypatch, capsys):
    code, _, err = run_cli(["sim", "openb", "--jobs", "0"], monkeypatch, capsys)
    assert code == 2
    assert "--jobs" in err


def test_help_lists_every_registered_policy_with_its_summary(monkeypatch, capsys):
    code, out, _ = run_cli(["sim", "openb", "--help"], monkeypatch, capsys)
    assert code == 0
    words = " ".join(out.split())  # help wraps at the terminal's width
    for name, policy in PLACEMENT.items():
        assert f"{name}: {policy.summary}" in words


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("42", [42]), ("42-45", [42, 43, 44, 45]), ("42,43,50", [42, 43, 50]), (" 42, 43 ", [42, 43])],
)
def test_seeds_accept_one_a_range_or_a_list(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "x", "42-", "-42", "42,,43", "42-43,44", "1.5"])
def test_seeds_reject_anything_else(text):
    with pytest.raises(UserError, match="invalid --seeds"):
        parse_seeds(text)


@pytest.mark.slow
def test_one_run_prints_a_table_and_writes_results_and_a_plot(monkeypatch, capsys, tmp_path):
    out_dir = tmp_path / "out"
    args = ["sim", "openb", "--policy", "fgd", "--seeds", "42", "--out", str(out_dir), "--plot"]
    code, out, _ = run_cli(args, monkeypatch, capsys)
    assert code == 0
    assert "fgd" in out and "4.77 ± 0.11" in out  # the paper's figure for default/fgd sits beside ours

    records = json.loads((out_dir / "results.json").read_text())
    assert len(records) == 1
    record = records[0]
    assert {"trace", "policy", "seed", "unallocated_pct_at_100", "wall_seconds", "failed_pods"} <= set(record)
    assert (record["trace"], record["policy"], record["seed"]) == ("default", "fgd", 42)
    # the paper's own seed 42 run, within the fidelity tolerance of benchmarks/openb_repro.py
    published = published_results()[("default", "fgd")]
    paper_seed_42 = published.unallocated_pct[published.seeds.index(42)]
    assert abs(record["unallocated_pct_at_100"] - paper_seed_42) <= max(0.5, 2 * published.sd), (
        record["unallocated_pct_at_100"], paper_seed_42)  # fmt: skip
    assert record["failed_pods"] > 0  # the trace is inflated to 130 % of capacity

    with (out_dir / "results.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1
    assert json.loads(rows[0]["policy_fallbacks"]) == record["policy_fallbacks"]

    png = out_dir / "unallocated_vs_arrival.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000
    for path in (out_dir / "results.json", out_dir / "results.csv", png):
        assert str(path) in out


BROKEN_POLICY = """
from gpuslice.programs.api import PlacementOps


class Broken(PlacementOps):
    name = "broken"
    summary = "raises on every score"

    def score(self, view, req, nodes):
        raise RuntimeError("boom")
"""


def test_a_policy_that_fell_back_is_an_error_unless_allowed_and_then_marked(monkeypatch, capsys, tmp_path):
    policy = tmp_path / "broken.py"
    policy.write_text(BROKEN_POLICY)
    out_dir = tmp_path / "out"
    args = ["sim", "openb", "--policy", str(policy), "--seeds", "42", "--out", str(out_dir)]
    code, out, err = run_cli(args, monkeypatch, capsys)
    said = _after_progress(err)  # stderr: the progress lines, then what went wrong
    assert code == 2 and said.startswith("error: policies fell back to the default placement")
    assert "--allow-fallbacks" in said and not out_dir.exists()

    code, out, err = run_cli([*args, "--allow-fallbacks"], monkeypatch, capsys)
    assert code == 0 and "broken.py*" in out
    [record] = json.loads((out_dir / "results.json").read_text())
    assert record["fell_back_pods"] == record["pods"] > 0  # detached after 5 faults: all default's
    assert f"{record['pods']:,} of {record['pods']:,} decisions" in err
    assert _after_progress(err).startswith("warning: ")


def _after_progress(err: str) -> str:
    """stderr without the progress lines (``sim openb: ...``) that come first where no terminal is."""
    lines = err.splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("sim openb: "))
