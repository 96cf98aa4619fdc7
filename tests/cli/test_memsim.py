"""``gpuslice memsim``: issue JSON fields, --compare all includes belady, unknown names list known ones."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from gpuslice.cli import memsim
from gpuslice.errors import UserError

app = typer.Typer()
app.command("memsim")(memsim.memsim)
app.command("noop")(lambda: None)  # two commands, so "memsim" is a subcommand as it will be when registered


def test_json_lists_every_eviction_policy_with_the_required_fields():
    result = CliRunner().invoke(
        app, ["memsim", "--workload", "gemm", "--scale", "0.1", "--compare", "all", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert "belady" in {r["evict"] for r in rows}
    required = {
        "workload",
        "oversub",
        "evict",
        "prefetch",
        "faults",
        "evictions",
        "migrated_bytes",
        "estimated_seconds",
    }
    assert all(required <= r.keys() for r in rows)


def test_table_and_plot(tmp_path):
    args = [
        "memsim",
        "--workload",
        "gemm",
        "--scale",
        "0.1",
        "--evict",
        "lfu",
        "--plot",
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "lfu" in result.output and (tmp_path / "memsim.png").stat().st_size > 0


def test_unknown_policy_is_a_user_error_listing_known_names():
    result = CliRunner().invoke(app, ["memsim", "--evict", "lru"])
    assert isinstance(result.exception, UserError) and "known: default" in str(result.exception)


def test_unknown_workload_is_a_user_error():
    result = CliRunner().invoke(app, ["memsim", "--workload", "nope"])
    assert isinstance(result.exception, UserError) and "rand-stream" in str(result.exception)
