"""The serve stage without a GPU: what its jobs' results must show per sharing mode, the metrics it
reads, and a mode the server does not offer (the shim) recorded as not available."""

from __future__ import annotations

import os
import sys
from enum import Enum

import acceptance_helpers
import pytest

from gpu_acceptance import serve_check
from gpu_acceptance.runner import Context, Stage, run_stages
from gpuslice.node import enforcement
from gpuslice.node.enforcement import SharingMode


def job(beyond_torch="oom", beyond_driver=2, rate=50.0, asked=0.3, events=()):
    result = {"pid": 1, "matmuls_per_s": rate, "beyond_torch": beyond_torch, "beyond_driver": beyond_driver}
    return {"result": result, "asked": asked, "events": list(events), "state": "SUCCEEDED"}


KILL = {"kind": "enforcement", "detail": {"action": "kill", "used": 9, "limit": 4}}


def failed(checks):
    return [c["name"] for c in checks if not c["ok"]]


def test_hard_mode_passes_when_both_allocations_beyond_the_slice_fail_and_shares_hold():
    jobs = {"job_a": job(rate=29.0, asked=0.3), "job_b": job(rate=61.0, asked=0.6)}
    checks = serve_check.analyse("mps", jobs, baseline_rate=100.0)
    assert not failed(checks) and jobs["job_a"]["achieved"] == pytest.approx(0.29)


def test_hard_mode_fails_when_the_driver_allocation_succeeds_or_a_share_is_exceeded():
    jobs = {"job_a": job(beyond_driver=0, rate=30.0), "job_b": job(rate=90.0, asked=0.6)}
    assert failed(serve_check.analyse("mps", jobs, baseline_rate=100.0)) == [
        "job_a: driver allocation beyond the slice fails",
        "job_b: compute share at most asked + 0.15",
    ]


def test_soft_mode_needs_the_monitor_to_catch_the_driver_allocation():
    caught = {"job_a": job(beyond_driver=0, events=[KILL])}
    missed = {"job_a": job(beyond_driver=0)}
    checks = serve_check.analyse("soft", caught, baseline_rate=100.0)
    assert not failed(checks)
    monitor = next(c for c in checks if "monitor" in c["name"])
    assert monitor["actions"] == ["kill"]  # what the daemon's event says it did
    assert failed(serve_check.analyse("soft", missed, baseline_rate=100.0)) == [
        "job_a: driver allocation beyond the slice caught by the monitor"
    ]


def test_a_job_without_a_result_fails_its_first_check_only():
    jobs = {"job_a": {"result": {}, "asked": 0.3, "events": [], "state": "FAILED"}}
    checks = serve_check.analyse("mps", jobs, baseline_rate=100.0)
    assert [(c["name"], c["ok"]) for c in checks] == [("job_a ran inside its slice", False)]


def test_slice_memory_used_is_summed_per_job_from_the_metrics():
    text = (
        "# HELP gpuslice_slice_memory_used_bytes GPU memory a running job really holds on a GPU\n"
        "# TYPE gpuslice_slice_memory_used_bytes gauge\n"
        'gpuslice_slice_memory_used_bytes{job="j1",tenant="t",pod="",namespace="",gpu="0"} 1024.0\n'
        'gpuslice_slice_memory_used_bytes{job="j1",tenant="t",pod="",namespace="",gpu="1"} 2048.0\n'
        'gpuslice_slice_memory_used_bytes{job="j2",tenant="t",pod="",namespace="",gpu="0"} 5.0\n'
    )
    assert serve_check._metric_used(text) == {"j1": 3072, "j2": 5}


def _without_shim_mode(monkeypatch):
    modes = {m.name: m.value for m in SharingMode if m.value != "shim"}
    monkeypatch.setattr(enforcement, "SharingMode", Enum("SharingMode", modes))


def _without_shim_library(monkeypatch):
    def no_build(repo, module):
        raise FileNotFoundError("no C compiler")

    monkeypatch.setattr(serve_check, "shim_library", no_build)


@pytest.mark.parametrize(
    ("take_away", "reason"),
    [(_without_shim_mode, "no --sharing shim (modes: "), (_without_shim_library, "no C compiler")],
    ids=["serve-has-no-shim-mode", "the-shim-library-cannot-be-built"],
)  # fmt: skip
def test_without_the_shim_its_stage_is_not_available(take_away, reason, tmp_path, monkeypatch):
    take_away(monkeypatch)
    ctx = Context(repo=tmp_path, out_dir=tmp_path, python=sys.executable, env=dict(os.environ))
    records = run_stages(ctx, [Stage("serve_shim", serve_check.serve_stage("shim"), 10)], 30, lambda _: None)
    assert records["serve_shim"]["status"] == "not available"
    assert reason in records["serve_shim"]["reason"]


# Stands in for the PyTorch job on a machine without a GPU: the same output lines, figures made up.
GPU_LESS_JOB = """
import json, os, sys, time
share = float(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")) / 100
print(json.dumps({"phase": "computing", "pid": os.getpid()}), flush=True)
time.sleep(0.5)
print(json.dumps({"pid": os.getpid(), "matmuls_per_s": 100.0, "beyond_torch": "oom", "beyond_driver": 0}))
"""


def test_serve_stage_runs_three_jobs_through_a_real_server_and_records_every_check(tmp_path, dgx_h100_smi):
    """Against `gpuslice serve --simulate`: the server starts and stops, the jobs' output and events come
    back through the API, nvidia-smi is asked for the jobs' processes. A simulated machine holds no GPU
    memory, so the memory and monitor checks fail here, and are recorded, as on a GPU they must pass."""
    ctx = Context(repo=acceptance_helpers.ROOT, out_dir=tmp_path, python=sys.executable,
                  env={**os.environ, "PYTHONPATH": str(acceptance_helpers.ROOT / "src")},
                  options={"simulate": "dgx-h100", "serve_job_program": GPU_LESS_JOB,
                           "nvidia_smi": str(dgx_h100_smi)})  # fmt: skip
    records = run_stages(
        ctx, [Stage("serve_soft", serve_check.serve_stage("soft"), 120)], 150, lambda _: None
    )
    record = records["serve_soft"]
    assert record["status"] == "failed", record
    assert record["baseline"]["matmuls_per_s"] == 100.0 and record["baseline"]["state"] == "SUCCEEDED"
    assert set(record["jobs"]) == {"job_a", "job_b"}
    assert {j["state"] for j in record["jobs"].values()} == {"SUCCEEDED"}
    checks = {c["name"]: c["ok"] for c in record["checks"]}
    assert checks["job_a ran inside its slice"] and checks["job_b: PyTorch allocation beyond the slice fails"]
    assert not checks["job_a: driver allocation beyond the slice caught by the monitor"]  # nothing to catch
    assert not checks["job_a memory"] and not checks["job_b memory"]  # nvidia-smi lists no such process
    assert record["jobs"]["job_a"]["achieved"] == 1.0  # soft mode does not divide compute


FAKE_SHIM_INIT = """
from pathlib import Path
LIB = Path(__file__).parent / "lib" / "libshim.so"
def library_path():
    if not LIB.is_file():
        raise RuntimeError(f"the shim is not built ({LIB} is missing)")
    return LIB
"""
FAKE_SHIM_BUILD = """
from pathlib import Path
def build_shim(source_dir, out_dir):
    if not (Path(source_dir) / "shim.c").is_file():
        raise RuntimeError(f"no sources in {source_dir}")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "libshim.so").write_text("built")
"""


def fake_shim_package(tmp_path, name):
    package = tmp_path / "pkgs" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_SHIM_INIT)
    (package / "build.py").write_text(FAKE_SHIM_BUILD)
    sys.path.insert(0, str(tmp_path / "pkgs"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(tmp_path / "pkgs"))


def test_a_checkout_without_the_built_shim_builds_it_from_native_sources(tmp_path):
    shim = fake_shim_package(tmp_path, "fake_shim_built_here")
    (tmp_path / "native" / "shim").mkdir(parents=True)
    (tmp_path / "native" / "shim" / "shim.c").write_text("/* sources */")
    path = serve_check.shim_library(tmp_path, shim)
    assert path.read_text() == "built" and path.parent.name == "lib"


def test_a_shim_that_cannot_be_built_raises_with_the_builders_reason(tmp_path):
    shim = fake_shim_package(tmp_path, "fake_shim_without_sources")
    with pytest.raises(RuntimeError, match="no sources in"):
        serve_check.shim_library(tmp_path, shim)
