"""The serve stage without a GPU: what its jobs' results must show per sharing mode, the metrics it
reads, and a mode the server does not offer (the shim) recorded as not available."""

from __future__ import annotations

import os
import sys

import acceptance_helpers  # noqa: F401  (puts scripts/ on sys.path)
import pytest

from gpu_acceptance import serve_check
from gpu_acceptance.runner import Context, Stage, run_stages
from gpuslice.node.enforcement import SharingMode


def job(beyond_torch="oom", beyond_driver=2, rate=50.0, asked=0.3, events=()):
    result = {"pid": 1, "matmuls_per_s": rate, "beyond_torch": beyond_torch, "beyond_driver": beyond_driver}
    return {"result": result, "asked": asked, "events": list(events), "state": "SUCCEEDED"}


KILL = {"kind": "enforcement", "data": {"action": "kill"}}


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
    assert not failed(serve_check.analyse("soft", caught, baseline_rate=100.0))
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


@pytest.mark.skipif("shim" in {m.value for m in SharingMode}, reason="this gpuslice has a shim mode")
def test_without_a_shim_mode_the_shim_stage_is_not_available(tmp_path):
    ctx = Context(repo=tmp_path, out_dir=tmp_path, python=sys.executable, env=dict(os.environ))
    records = run_stages(ctx, [Stage("serve_shim", serve_check.serve_stage("shim"), 10)], 30, lambda _: None)
    assert records["serve_shim"]["status"] == "not available"
    assert "no --sharing shim" in records["serve_shim"]["reason"]
