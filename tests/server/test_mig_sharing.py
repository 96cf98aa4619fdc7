"""``--sharing mig`` end to end through the daemon and a real ``LocalNode`` (real job processes): the
job's MIG instance is created with the planner's command, the job sees its UUID, and the instance is
destroyed when the job ends; a refused or failed command fails the job with a reason and an event, and
the daemon goes on. No GPU: a fake ``nvidia-smi`` first on PATH and a fake pynvml (tests/node)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))  # the node tests' fakes
from test_mig_manager import NO_ROOT, FakeSmi, a100_nvml

from gpuslice.node.discovery import discover
from gpuslice.node.mig_manager import MigManager
from gpuslice.server.daemon import Daemon
from gpuslice.server.local_node import LocalNode
from gpuslice.server.store import Store
from gpuslice.workload.job import JobSpec, JobState

PRINT_DEVICES = (sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")


@pytest.fixture
def smi(tmp_path, monkeypatch) -> FakeSmi:
    fake = FakeSmi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.directory}:{os.environ['PATH']}")
    return fake


@pytest.fixture
def mig_daemon(tmp_path, smi):
    nvml = a100_nvml(smi)
    machine = discover(nvml=nvml)
    state = tmp_path / "state"
    node = LocalNode(machine, state, "mig", mig=MigManager(machine, state, nvml=nvml, timeout_seconds=10),
                     nvml=nvml)  # fmt: skip
    store = Store(tmp_path / "state.db")
    yield Daemon(store, machine, node, state, sharing="mig", monitor_seconds=0.0)
    store.close()


def run_until_done(daemon: Daemon, job_id: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while daemon.store.get(job_id).state in (JobState.PENDING, JobState.RUNNING):
        assert time.monotonic() < deadline, daemon.store.get(job_id)
        daemon.tick()
        time.sleep(0.05)


def test_a_mig_job_gets_a_created_instance_and_it_is_destroyed_when_the_job_ends(mig_daemon, smi):
    job = mig_daemon.submit(JobSpec(command=PRINT_DEVICES, mig_profile="3g.40gb"))
    mig_daemon.tick()
    running = mig_daemon.store.get(job.id)
    gpu, start = running.mig["gpu"], running.mig["start"]
    assert smi.calls() == [f"nvidia-smi mig -i {gpu} -cgi 9:{start} -C"]
    run_until_done(mig_daemon, job.id)
    done = mig_daemon.store.get(job.id)
    assert done.state is JobState.SUCCEEDED, done.reason
    uuid = f"MIG-fake-{gpu}-1"
    assert (mig_daemon.state_dir / "jobs" / job.id / "stdout.log").read_text().strip() == uuid
    assert smi.calls()[1:] == [
        f"nvidia-smi mig -i {gpu} -dci -ci 0 -gi 1",
        f"nvidia-smi mig -i {gpu} -dgi -gi 1",
    ]
    assert smi.devices(gpu) == []


def test_without_root_the_job_fails_with_a_clear_reason_and_an_event_and_the_daemon_goes_on(mig_daemon, smi):
    smi.refuse("-cgi", 4, NO_ROOT)
    job = mig_daemon.submit(JobSpec(command=PRINT_DEVICES, mig_profile="3g.40gb"))
    mig_daemon.tick()
    failed = mig_daemon.store.get(job.id)
    assert failed.state is JobState.FAILED
    assert "could not launch" in failed.reason and "needs root" in failed.reason
    assert "-cgi 9:" in failed.reason and "Insufficient Permissions" in failed.reason
    events = [e for _, e in mig_daemon.store.events(job.id) if e.kind == "mig"]
    assert len(events) == 1 and events[0].detail["returncode"] == 4
    assert events[0].detail["command"].startswith("nvidia-smi mig -i ")
    smi.allow()  # root now (say): the next job starts as usual
    again = mig_daemon.submit(JobSpec(command=PRINT_DEVICES, mig_profile="1g.10gb"))
    run_until_done(mig_daemon, again.id)
    assert mig_daemon.store.get(again.id).state is JobState.SUCCEEDED


def test_a_failed_create_fails_the_job_with_the_command_and_its_output(mig_daemon, smi):
    smi.refuse("-cgi", 2, "Failed to create GPU instance: Insufficient Resources", stderr=True)
    job = mig_daemon.submit(JobSpec(command=PRINT_DEVICES, mig_profile="3g.40gb"))
    mig_daemon.tick()
    failed = mig_daemon.store.get(job.id)
    assert failed.state is JobState.FAILED
    assert "failed (exit 2): Failed to create GPU instance: Insufficient Resources" in failed.reason
    assert all(smi.devices(g) == [] for g in range(2))
