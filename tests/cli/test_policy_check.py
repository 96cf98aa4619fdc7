"""``gpuslice policy check`` (the verifier, locally) and what the server commands say without a server."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuslice.cli.main import app
from gpuslice.errors import GpusliceError, exit_code

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies"
runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) as ``main()`` would give them."""
    result = runner.invoke(app, ["policy", *args], env={"COLUMNS": "200"})
    if isinstance(result.exception, GpusliceError):
        return exit_code(result.exception), result.stdout, f"error: {result.exception}"
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_check_accepts_the_examples_with_one_line_naming_family_and_class(example):
    code, out, err = run("check", str(example))
    assert code == 0 and err == ""
    (line,) = out.strip().splitlines()
    assert line.startswith(f"{example}: ok — ") and " policy " in line


def test_check_of_a_queue_policy_with_a_map_names_the_map(tmp_path):
    code, out, _ = run("check", str(EXAMPLES / "small_first.py"))
    assert code == 0 and "queue policy SmallFirst" in out and "boost: Map(key=str, value=int" in out


def test_check_prints_every_violation_as_file_line_message_and_exits_2(tmp_path):
    path = tmp_path / "sneaky.py"
    path.write_text(
        "import os\n"
        "from gpuslice.programs.api import QueueOps\n"
        "\n"
        "class Sneaky(QueueOps):\n"
        "    def priority(self, view, job):\n"
        "        while True:\n"
        "            eval('1')\n"
    )
    code, out, err = run("check", str(path))
    assert code == 2
    lines = out.strip().splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [f"{path}:1", f"{path}:6", f"{path}:7"]
    assert all(len(line.split(": ", 1)[1]) > 10 for line in lines)  # each says why, in a sentence
    assert err.strip() == f"error: {path} rejected by the verifier: 3 violations"


def test_check_of_a_missing_file_is_one_error_line(tmp_path):
    code, out, err = run("check", str(tmp_path / "nope.py"))
    assert code == 2 and out == ""
    assert err == f"error: cannot read policy file {tmp_path / 'nope.py'}: No such file or directory"


@pytest.mark.parametrize(
    "args",
    [("list",), ("unload", "queue"), ("events",), ("map", "dump", "boost"), ("map", "update", "b", "1", "2")],
    ids=["list", "unload", "events", "map dump", "map update"],
)
def test_server_commands_without_a_server_say_how_to_start_one(args, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLICE_TOKEN", "any")
    code, _, err = run(*args, "--url", "http://127.0.0.1:9")
    assert code == 2 and "no gpuslice server at http://127.0.0.1:9" in err and "gpuslice serve" in err


def test_load_without_a_server_reads_the_file_first_then_says_how_to_start_one(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLICE_TOKEN", "any")
    code, _, err = run("load", str(EXAMPLES / "small_first.py"), "--url", "http://127.0.0.1:9")
    assert code == 2 and "no gpuslice server" in err


def test_help_explains_each_command():
    code, out, _ = run("--help")
    assert code == 0 and all(c in out for c in ("check", "load", "list", "unload", "events", "map"))
    code, out, _ = run("map", "update", "--help")
    assert code == 0 and "bpftool" in out and "--family" in out


def test_export_prints_a_builtin_as_a_file_that_check_accepts(tmp_path):
    code, out, _ = run("export", "bestfit")
    assert code == 0 and "from gpuslice.programs.api import" in out and "class BestFit(PlacementOps)" in out
    path = tmp_path / "bestfit.py"
    path.write_text(out)
    code, out, _ = run("check", str(path))
    assert code == 0 and "placement policy BestFit" in out


@pytest.mark.parametrize("flag", ["--out", "-o", "--output"])
def test_export_writes_to_a_file_with_out_as_every_command_names_it(tmp_path, flag):
    path = tmp_path / "lfu.py"
    code, out, _ = run("export", "lfu", flag, str(path))
    assert code == 0 and out == ""
    assert "class Lfu(MemoryOps)" in path.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fifo"], "'fifo' is a built-in queue or eviction policy: say which with --family"),
        (["fdg"], "'fdg' is not a built-in policy; known: 2q, adaptive-seq"),
        (["priority", "--family", "prefetch"], "prefetch policy 'priority' cannot be written as a file"),
        (["fifo", "--family", "mig"], "'mig' is not a policy family"),
    ],
    ids=["name in two families", "unknown name", "built on another policy", "unknown family"],
)
def test_export_refuses_with_a_user_error(args, message):
    code, _, err = run("export", *args)
    assert code == 2 and message in err
