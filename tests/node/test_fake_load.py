"""gpuslice-fake-load reports its simulated GPU memory atomically, grows, and ends on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess

from node_helpers import PY, wait_for

from gpuslice.node.fake_load import main, memory_at, visible_devices
from gpuslice.units import GiB

FAKE_LOAD = [PY, "-m", "gpuslice.node.fake_load"]


def test_report_file_holds_the_memory_per_visible_device_and_the_exit_code_is_chosen(tmp_path, monkeypatch):
    report = tmp_path / "report.json"
    monkeypatch.setenv("GPUSLICE_REPORT_FILE", str(report))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-sim-1,GPU-sim-2")
    assert main(["--mem", "12GiB", "--seconds", "0", "--exit-code", "3"]) == 3
    data = json.loads(report.read_text())
    assert data["pid"] == os.getpid()
    assert data["memory_bytes"] == {"GPU-sim-1": 12 * GiB, "GPU-sim-2": 12 * GiB}
    assert not list(tmp_path.glob(".*.tmp"))


def test_memory_grows_linearly_then_holds():
    assert memory_at(0, 10, 30, grow_seconds=10) == 10
    assert memory_at(5, 10, 30, grow_seconds=10) == 20
    assert memory_at(50, 10, 30, grow_seconds=10) == 30
    assert memory_at(5, 10, None, grow_seconds=10) == 10


def test_visible_devices_follow_cuda_visible_devices():
    assert visible_devices({}) == ["0"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "MIG-x, GPU-y"}) == ["MIG-x", "GPU-y"]


def test_sigterm_releases_the_memory_and_exits_143(tmp_path):
    report = tmp_path / "report.json"
    env = {**os.environ, "GPUSLICE_REPORT_FILE": str(report), "CUDA_VISIBLE_DEVICES": "0"}
    with subprocess.Popen(
        [*FAKE_LOAD, "--mem", "1GiB", "--seconds", "60"], env=env, stdout=subprocess.DEVNULL
    ) as proc:
        wait_for(report.exists)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 143
    assert json.loads(report.read_text())["memory_bytes"] == {"0": 0}


def test_ignore_term_keeps_running_until_killed(tmp_path):
    report = tmp_path / "report.json"
    env = {**os.environ, "GPUSLICE_REPORT_FILE": str(report)}
    with subprocess.Popen(
        [*FAKE_LOAD, "--mem", "1GiB", "--seconds", "60", "--ignore-term"], env=env, stdout=subprocess.DEVNULL
    ) as proc:
        wait_for(report.exists)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=1.0)
            raise AssertionError("fake-load ended on SIGTERM despite --ignore-term")
        except subprocess.TimeoutExpired:
            pass
        proc.kill()
        assert proc.wait(timeout=10) == -signal.SIGKILL
