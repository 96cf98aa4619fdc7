"""gpuslice mig plan / profiles: output, commands, and user errors that exit 2 through the root app."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from gpuslice.cli.mig import app, slot_diagram
from gpuslice.errors import GpusliceError, UserError, exit_code
from gpuslice.hardware.mig import mig_gpu, parse_layout

runner = CliRunner()


def invoke(*args: str, env: dict[str, str] | None = None):
    result = runner.invoke(app, list(args), env=env or {"COLUMNS": "120"})
    return result


def test_plan_prints_placements_and_the_exact_commands():
    result = invoke("plan", "--gpu", "a100-80gb", "--request", "3g.40gb", "--request", "1g.10gb")
    assert result.exit_code == 0, result.output
    assert "nvidia-smi mig -i 0 -cgi 9:4 -C" in result.output
    assert "nvidia-smi mig -i 0 -cgi 19:3 -C" in result.output
    assert "3g.40gb   . . . . # # # #" in result.output


def test_plan_with_a_layout_and_first_free_reports_rejections():
    result = invoke("plan", "--gpu", "A100-80GB", "--request", "4g.40gb", "--request", "12GiB",
                    "--policy", "first-free", "--from-layout", "1g.10gb@3/4", "--gpu-index", "1")  # fmt: skip
    assert result.exit_code == 3, result.output  # a rejection: scripts can tell
    assert "rejected 4g.40gb" in result.output
    assert "nvidia-smi mig -i 1 -cgi 15:6 -C" in result.output


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("plan", "--gpu", "v100", "--request", "1g.10gb"), "no MIG profile table"),
        (("plan", "--gpu", "a100-80gb", "--request", "9g.90gb"), "not a MIG profile"),
        (("plan", "--gpu", "a100-80gb", "--request", "100GiB"), "does not fit any MIG profile"),
        (("plan", "--gpu", "a100-80gb", "--request", "1g.10gb", "--policy", "best"), "not a MIG placement"),
        (
            ("plan", "--gpu", "a100-80gb", "--request", "1g.10gb", "--from-layout", "3g.40gb@1"),
            "cannot start",
        ),
        (("profiles", "--gpu", "t4"), "no MIG profile table"),
    ],
)
def test_user_errors_are_gpuslice_user_errors_that_exit_2(args, match):
    result = invoke(*args)
    assert isinstance(result.exception, UserError), result.output
    assert match in str(result.exception)
    assert exit_code(result.exception) == 2


def test_profiles_lists_the_table_in_80_columns():
    result = invoke("profiles", "--gpu", "h200-141gb", env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "3g.71gb" in result.output and "139.8 GiB" in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80


def test_profiles_json_is_the_table_for_scripts():
    result = invoke("profiles", "--gpu", "a100-80gb", "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["gpu"] == "A100-80GB"
    first = data["profiles"][0]
    assert {k: first[k] for k in ("profile", "id", "memory_bytes", "memory_slices", "starts", "sms")} == {
        "profile": "1g.10gb", "id": 19, "memory_bytes": 9728 * 2**20, "memory_slices": 1,
        "starts": [0, 1, 2, 3, 4, 5, 6], "sms": 14,
    }  # fmt: skip
    assert [p["profile"] for p in data["profiles"]][-1] == "7g.80gb"


def test_slot_diagram_marks_idle_instances_and_free_slots():
    text = slot_diagram(parse_layout(mig_gpu("a100-80gb"), "4g.40gb@0/1, 1g.10gb@6/9:idle"))
    assert text.splitlines()[1:] == [
        "4g.40gb   # # # # . . . .",
        "1g.10gb   . . . . . . # .  idle",
        "free      . . . . - - . -",
    ]


def test_the_app_is_a_typer_app_for_the_root_to_mount():
    assert isinstance(app, typer.Typer)
    assert issubclass(UserError, GpusliceError)
