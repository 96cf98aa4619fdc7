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
    rows = json.loads(result.stdout)  # stderr: the progress lines
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


def test_the_compare_plot_labels_every_policy_without_overlap():
    from gpuslice.cli.memsim import _figure
    from gpuslice.memory.simulator import SimResult

    results = [SimResult.__new__(SimResult) for _ in range(11)]
    names = ["default", "fifo", "lfu", "mru", "mru-textbook", "freq-decay", "fifo-chance", "pid-quota",
             "2q", "priority", "belady"]  # fmt: skip
    for r, name, seconds in zip(results, names, range(1, 12), strict=True):
        object.__setattr__(r, "evict", name)
        object.__setattr__(r, "prefetch", "tree")
        object.__setattr__(r, "estimated_seconds", float(seconds))
    fig = _figure(results, results[0], "test")
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t for t in ax.get_yticklabels() if t.get_text()]
    assert [t.get_text() for t in labels] == [f"{n} / tree" for n in names]
    boxes = [t.get_window_extent() for t in labels]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
