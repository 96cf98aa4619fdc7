"""The supervisor runs a command, captures its output and records how it ended in exit.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from node_helpers import PY, wait_for

from gpuslice.node.supervisor import EXIT_FILE, main

SUPERVISOR = [PY, "-m", "gpuslice.node.supervisor"]


def run_supervised(job_dir: Path, *command: str, timeout: float = 20) -> dict:
    subprocess.run(
        [*SUPERVISOR, "--job-dir", str(job_dir), "--", *command],
        timeout=timeout,
        start_new_session=True,
        check=False,
    )
    return json.loads((job_dir / EXIT_FILE).read_text())


@pytest.mark.parametrize(
    ("name", "code", "exit_code", "sig"),
    [
        ("success", "print('hi')", 0, None),
        ("failure", "import sys; sys.exit(3)", 3, None),
        ("killed by a signal", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + 9, 9),
    ],
)
def test_exit_json_records_how_the_command_ended(tmp_path, name, code, exit_code, sig):
    record = run_supervised(tmp_path / "job", PY, "-c", code)
    assert (record["exit_code"], record["signal"]) == (exit_code, sig), name
    assert record["finished_at"] >= record["started_at"] > 0
    assert not [p for p in (tmp_path / "job").iterdir() if p.name.endswith(".tmp")]  # atomic: no leftovers


def test_stdout_and_stderr_are_captured_in_log_files(tmp_path):
    run_supervised(
        tmp_path / "job", PY, "-c", "import sys; print('to out'); print('to err', file=sys.stderr)"
    )
    assert (tmp_path / "job" / "stdout.log").read_text() == "to out\n"
    assert (tmp_path / "job" / "stderr.log").read_text() == "to err\n"


def test_a_command_that_does_not_exist_exits_127_with_the_reason_in_stderr(tmp_path):
    record = run_supervised(tmp_path / "job", "/no/such/program", "x")
    assert record["exit_code"] == 127 and record["signal"] is None
    assert "/no/such/program" in (tmp_path / "job" / "stderr.log").read_text()


def test_cwd_and_environment_are_passed_to_the_command(tmp_path):
    job = tmp_path / "job"
    env = {**os.environ, "GPUSLICE_TEST_VALUE": "42"}
    subprocess.run(
        [
            *SUPERVISOR,
            "--job-dir",
            str(job),
            "--cwd",
            str(tmp_path),
            "--",
            PY,
            "-c",
            "import os; print(os.getcwd(), os.environ['GPUSLICE_TEST_VALUE'])",
        ],
        env=env,
        timeout=20,
        start_new_session=True,
        check=True,
    )
    assert (job / "stdout.log").read_text().split() == [str(tmp_path), "42"]


def test_sigterm_to_the_supervisor_is_forwarded_and_the_command_may_exit_cleanly(tmp_path):
    job = tmp_path / "job"
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(7)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    sup = subprocess.Popen([*SUPERVISOR, "--job-dir", str(job), "--", PY, "-c", code], start_new_session=True)
    wait_for(lambda: (job / "stdout.log").exists() and "ready" in (job / "stdout.log").read_text())
    sup.send_signal(signal.SIGTERM)  # to the supervisor only, as launcher.terminate does
    assert sup.wait(timeout=10) == 7  # the supervisor survives the TERM and exits with the job's code
    record = json.loads((job / EXIT_FILE).read_text())
    assert (record["exit_code"], record["signal"]) == (7, None)
    assert (job / "stdout.log").read_text().count("got TERM") == 1  # delivered once, not echoed back


def test_main_without_a_command_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["--job-dir", str(tmp_path / "job")])
    assert exc.value.code == 2
    assert not (tmp_path / "job").exists()


def test_supervisor_runs_by_path_in_isolated_mode_as_the_launcher_starts_it(tmp_path):
    import gpuslice.node.supervisor as supervisor

    job = tmp_path / "job"
    subprocess.run(
        [PY, "-I", supervisor.__file__, "--job-dir", str(job), "--", sys.executable, "-c", "print(1)"],
        timeout=20,
        start_new_session=True,
        check=True,
    )
    assert json.loads((job / EXIT_FILE).read_text())["exit_code"] == 0
    assert (job / "stdout.log").read_text() == "1\n"
