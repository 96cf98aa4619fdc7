"""The acceptance runner: a stage that fails, crashes, is not available or overruns is recorded and the
next stage still runs; subprocesses stop at the stage's limit; the overall budget skips what is left."""

from __future__ import annotations

import os
import sys
import threading

import acceptance_helpers  # noqa: F401  (puts scripts/ on sys.path)

from gpu_acceptance import main as acceptance
from gpu_acceptance.runner import Context, NotAvailable, Stage, render_table, run_command, run_stages
from gpu_acceptance.smi import check


def context(tmp_path, **options) -> Context:
    return Context(
        repo=tmp_path, out_dir=tmp_path, python=sys.executable, env=dict(os.environ), options=options
    )


def run(ctx, stages, budget=60.0):
    lines: list[str] = []
    return run_stages(ctx, stages, budget, lines.append), lines


def test_each_outcome_is_recorded_and_later_stages_still_run(tmp_path):
    def crash(ctx):
        raise ZeroDivisionError("boom")

    def absent(ctx):
        raise NotAvailable("no such mode here")

    stages = [
        Stage("good", lambda ctx: {"checks": [check("fine", True)]}, 5),
        Stage("bad", lambda ctx: {"checks": [check("fine", True), check("broken", False, got=3)]}, 5),
        Stage("crash", crash, 5),
        Stage("absent", absent, 5),
        Stage("last", lambda ctx: {"checks": [check("reached", True)], "saw": sorted(ctx.records)}, 5),
    ]
    records, lines = run(context(tmp_path), stages)
    assert [records[s.name]["status"] for s in stages] == ["ok", "failed", "error", "not available", "ok"]
    assert records["crash"]["error"] == "ZeroDivisionError: boom"
    assert records["last"]["saw"] == ["absent", "bad", "crash", "good"]
    table = render_table(records, stages)
    assert "| bad | failed |" in table and "failed: broken" in table and "no such mode here" in table
    assert len(lines) == 2 * len(stages)


def test_a_subprocess_is_killed_at_the_stage_limit(tmp_path):
    def sleeper(ctx):
        cmd = run_command(ctx, ["sleep", "60"], timeout_s=600)
        return {"checks": [check("sleep finished", not cmd.timed_out)], "seconds_run": cmd.seconds}

    records, _ = run(context(tmp_path), [Stage("sleeper", sleeper, 1.0)])
    assert records["sleeper"]["status"] == "failed"
    assert records["sleeper"]["seconds_run"] < 30  # stopped at the limit, not after 60 s


def test_a_stage_stuck_in_python_times_out_and_the_next_one_runs(tmp_path):
    release = threading.Event()
    stages = [
        Stage("stuck", lambda ctx: release.wait(120) and {}, 0.5),
        Stage("after", lambda ctx: {"checks": [check("ran", True)]}, 5),
    ]
    try:
        records, _ = run(context(tmp_path), stages)
    finally:
        release.set()
    assert records["stuck"]["status"] == "timeout" and records["after"]["status"] == "ok"


def test_stages_past_the_overall_budget_are_skipped(tmp_path):
    stages = [Stage("a", lambda ctx: {}, 5), Stage("b", lambda ctx: {}, 5)]
    records, _ = run(context(tmp_path), stages, budget=0.5)
    assert {r["status"] for r in records.values()} == {"skipped"}


def fake_python(tmp_path, stdout: str, code: int) -> str:
    program = tmp_path / "fake-python"
    program.write_text(f"#!/bin/sh\ncat <<'OUT'\n{stdout}\nOUT\nexit {code}\n")
    program.chmod(0o755)
    return str(program)


def test_gpu_tests_stage_reads_pytests_summary(tmp_path):
    ctx = context(tmp_path)
    ctx.python = fake_python(tmp_path, "SKIPPED [1] tests/x.py: no MPS\n3 passed, 1 skipped in 2.50s", 0)
    ctx.stage_deadline = float("inf")
    record = acceptance.gpu_tests_stage(ctx)
    assert record["counts"] == {"passed": 3, "skipped": 1}
    assert all(c["ok"] for c in record["checks"]) and record["skipped"] == ["SKIPPED [1] tests/x.py: no MPS"]


def test_gpu_tests_that_fail_or_all_skip_fail_the_stage(tmp_path):
    ctx = context(tmp_path)
    ctx.python = fake_python(tmp_path, "1 failed, 2 passed in 3.00s", 1)
    failed = acceptance.gpu_tests_stage(ctx)
    assert [c["ok"] for c in failed["checks"]] == [False, True]
    ctx.python = fake_python(tmp_path, "3 skipped in 0.50s", 0)
    skipped = acceptance.gpu_tests_stage(ctx)
    assert [c["ok"] for c in skipped["checks"]] == [True, False]


def test_only_files_with_gpu_tests_are_collected():
    files = acceptance.gpu_test_files(acceptance.REPO / "tests")
    assert "tests/node/test_gpu_enforcement.py" in files
    marker = "pytest.mark." + "gpu"  # spelt in two parts, so that this file is not one of them
    assert all(marker in (acceptance.REPO / f).read_text() for f in files)
    assert "tests/scripts/test_gpu_acceptance_runner.py" not in files
    assert "tests/k8s/test_extender.py" not in files


FAKE_PY_NO_CUPY = """#!/bin/sh
case "$*" in
  "-c import cupy") echo "ModuleNotFoundError: No module named 'cupy'" >&2; exit 1 ;;
  "-m pip install"*) echo "$*" > "{log}"; echo "ERROR: No matching distribution found for cupy" >&2; exit 1 ;;
esac
exit 0
"""


def test_missing_cupy_is_installed_for_the_drivers_cuda_and_a_failure_is_said(tmp_path):
    program = tmp_path / "py"
    program.write_text(FAKE_PY_NO_CUPY.replace("{log}", str(tmp_path / "pip.log")))
    program.chmod(0o755)
    ctx = context(tmp_path)
    ctx.python = str(program)
    ctx.records["env"] = {"driver": "580.159.03"}
    said = acceptance.ensure_cupy(ctx)
    assert said == "missing; pip install cupy-cuda13x failed: ERROR: No matching distribution found for cupy"
    assert "--retries 0 --timeout 15 cupy-cuda13x" in (tmp_path / "pip.log").read_text()
    ctx.records["env"] = {"driver": "535.129.03"}
    assert "cupy-cuda12x" in acceptance.ensure_cupy(ctx)
