"""``scripts/gpu-acceptance`` end to end without a GPU: a fake nvidia-smi on the command line, canned
unified-memory measurements (``--fake-um``), the real memsim CLI with the profile built from them.

Discovery needs NVML, which this machine lacks: that stage's error is recorded and the run goes on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from acceptance_helpers import ROOT, canned_worker_output, dgx_h100_smi_at

from gpu_acceptance import um
from gpuslice.memory.cost import load_cost_profile

SCRIPT = ROOT / "scripts" / "gpu-acceptance"
MIB = 1 << 20


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_fake_run_writes_json_table_and_profile_and_survives_a_failing_stage(tmp_path):
    canned = tmp_path / "um.jsonl"
    canned.write_text(canned_worker_output(um.make_plan(capacity_bytes=16 * MIB)))
    out = tmp_path / "out" / "gpu_acceptance.json"
    smi = dgx_h100_smi_at(tmp_path)
    names = "env,discovery,um,memsim,directions"
    args = ["--stages", names, "--fake-um", str(canned), "--nvidia-smi", str(smi)]
    # limits x10: the memsim stage starts one memsim process per sweep, slow on a loaded 2-core machine
    done = run_script(
        *args, "--capacity", "16MiB", "--limit-factor", "10", "--out", str(out), "--python", sys.executable
    )
    assert done.returncode == 1, done.stderr  # discovery cannot pass without NVML
    doc = json.loads(out.read_text())
    stages = doc["stages"]
    assert doc["fake"] is True and doc["gpu"] == "NVIDIA H100 80GB HBM3" and doc["driver"] == "535.129.03"
    assert stages["env"]["status"] == "ok"
    assert stages["discovery"]["status"] == "error"  # recorded, and the later stages still ran
    assert stages["um"]["status"] == "ok"
    profile = Path(stages["um"]["profile"]["path"])
    assert profile.parent == out.parent
    cost = load_cost_profile(profile)  # the memsim stage used this file
    assert cost.name == "canned (not a measurement)" and cost.link_bytes_per_s == 25e9
    rows = stages["memsim"]["rows"]
    assert len(rows) == len(um.SAFE_RATIOS) * 2
    assert all(r["memsim_s"] > 0 and r["measured_s"] > 0 for r in rows)
    assert stages["memsim"]["status"] in ("ok", "failed")  # within 25 % or not: both are recorded
    table = out.with_suffix(".md").read_text()
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == names.split(",")
    directions = doc["stages"]["directions"]
    assert directions["status"] == "ok"
    assert [r["policy"] for r in directions["rows"]] == ["default+always-max", "lfu+stride"]
    assert all(r["speedup"] > 0 for r in directions["rows"])
    assert "| discovery | error |" in table and "| um | ok |" in table
    assert "link 25.0 GB/s" in done.stdout


def test_unknown_stage_and_missing_canned_file_are_one_error_line(tmp_path):
    bad_stage = run_script("--stages", "env,warp", "--out", str(tmp_path / "x.json"))
    assert bad_stage.returncode == 2
    assert bad_stage.stderr.strip().splitlines() == [
        "error: unknown stage 'warp'; known: env, gpu_tests, discovery, um, memsim, directions, serve_soft, "
        "serve_mps, serve_shim"
    ]
    no_file = run_script("--fake-um", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x.json"))
    assert no_file.returncode == 2 and no_file.stderr.startswith("error: --fake-um ")
    bad_factor = run_script("--limit-factor", "0", "--out", str(tmp_path / "x.json"))
    assert bad_factor.returncode == 2 and bad_factor.stderr.startswith("error: --limit-factor 0.0: ")
    bad_size = run_script("--capacity", "lots", "--out", str(tmp_path / "x.json"))
    assert bad_size.returncode == 2 and bad_size.stderr.startswith("error: --capacity: ")
    assert not (tmp_path / "x.json").exists()
