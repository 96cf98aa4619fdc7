"""Per-job GPU memory (simulated reports and fake NVML, mapped through real process trees), external
memory, and the graded response escalating warn → suspend → kill over time."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import uuid

import psutil
import pytest
from node_helpers import PY, fake_pynvml, python_job, wait_for

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.node import launcher
from gpuslice.node.discovery import discover
from gpuslice.node.enforcement import job_env
from gpuslice.node.monitor import ActionKind, GradedResponse, ResponseConfig, job_processes, usage
from gpuslice.units import GiB, MiB
from gpuslice.workload.job import JobSpec
from job_cleanup import end_job

FAKE_LOAD = (PY, "-m", "gpuslice.node.fake_load")
# A job whose work runs in a grandchild: the monitor must follow the tree below the supervisor.
NESTED = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


@pytest.fixture
def groups():
    started: list[int] = []
    yield started
    for pgid in started:
        end_job(pgid)


def test_job_processes_maps_the_whole_tree_to_its_job(tmp_path, groups):
    sleeper = "import time; print('ready', flush=True); time.sleep(30)"
    nested = launcher.launch("nested", JobSpec(command=(PY, "-c", NESTED, PY, "-c", sleeper)), {}, tmp_path)
    groups.append(nested.pgid)
    out = launcher.log_paths(tmp_path, "nested")[0]
    wait_for(lambda: out.exists() and "ready" in out.read_text())
    owner = job_processes({"nested": nested.pid})
    family = [psutil.Process(nested.pid), *psutil.Process(nested.pid).children(recursive=True)]
    assert len(family) == 3  # supervisor, the NESTED python, the sleeper
    assert all(owner[p.pid] == "nested" for p in family)
    assert os.getpid() not in owner


# A job that leaves a daemon behind: the middle process exits, its child is re-parented outside the
# supervisor's tree but stays in the job's process group.
ORPHANER = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    if os.fork() == 0:\n"
    "        open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(30)\n"
    "    os._exit(0)\n"
    "os.wait(); time.sleep(30)\n"
)


def test_job_processes_keeps_a_daemonised_child_by_its_process_group_and_skips_gone_supervisors(
    tmp_path, groups
):
    marker = tmp_path / "orphan.pid"
    job = launcher.launch("orphaner", JobSpec(command=(PY, "-c", ORPHANER, str(marker))), {}, tmp_path)
    groups.append(job.pgid)
    wait_for(lambda: marker.exists() and marker.read_text().strip())
    orphan = int(marker.read_text())
    assert orphan not in {c.pid for c in psutil.Process(job.pid).children(recursive=True)}
    owner = job_processes({"orphaner": job.pid, "gone": 2**22 + 4321})
    assert owner[orphan] == "orphaner" and owner[job.pid] == "orphaner"
    assert "gone" not in owner.values()


def test_simulated_usage_reads_each_jobs_fake_load_report_and_counts_others_as_external(tmp_path, groups):
    # Fake UUIDs of our own: fake loads of other test runs on this host (same profile, same UUIDs)
    # would rightly count as external on dgx-h100 and make the numbers depend on the neighbours.
    token = uuid.uuid4().hex[:8]
    base = discover("dgx-h100")
    machine = Machine(
        "sim-test",
        tuple(dataclasses.replace(g, uuid=f"GPU-sim-{token}-{g.index:04d}") for g in base.gpus),
        base.topology,
    )
    a = JobSpec(command=(*FAKE_LOAD, "--mem", "12GiB", "--seconds", "30"), gpu_memory_bytes=20 * GiB)
    b = JobSpec(command=(PY, "-c", NESTED, *FAKE_LOAD, "--mem", "3GiB", "--seconds", "30"), gpus=2)
    job_a = launcher.launch("a", a, job_env("soft", a, (2,), machine, tmp_path), tmp_path)
    job_b = launcher.launch("b", b, job_env("soft", b, (0, 1), machine, tmp_path), tmp_path)
    idle = launcher.launch("idle", python_job("import time; time.sleep(30)"), {}, tmp_path)
    groups += [job_a.pgid, job_b.pgid, idle.pgid]
    outsider_report = tmp_path / "outsider.json"
    env = {
        **os.environ,
        "GPUSLICE_REPORT_FILE": str(outsider_report),
        "CUDA_VISIBLE_DEVICES": machine.gpus[7].uuid,
    }
    with subprocess.Popen(
        [*FAKE_LOAD, "--mem", "5GiB", "--seconds", "30"], env=env, stdout=subprocess.DEVNULL
    ) as outsider:
        try:
            jobs = {"a": job_a.pid, "b": job_b.pid, "idle": idle.pid}

            def all_reported():
                per_job, external = usage(machine, jobs)
                return (per_job, external) if per_job["a"] and per_job["b"] and external else None

            per_job, external = wait_for(all_reported)
            assert per_job == {"a": {2: 12 * GiB}, "b": {0: 3 * GiB, 1: 3 * GiB}, "idle": {}}
            assert external.get(7) == 5 * GiB
        finally:
            outsider.kill()


def test_nvml_usage_maps_pids_to_jobs_and_the_rest_to_external(tmp_path, groups):
    job = launcher.launch("real", python_job("import time; time.sleep(30)"), {}, tmp_path)
    groups.append(job.pgid)
    worker = wait_for(lambda: psutil.Process(job.pid).children())[0]
    nvml = fake_pynvml(
        [
            {
                "name": "NVIDIA L4",
                "total": 23034 * MiB,
                "uuid": "GPU-0",
                "processes": [(worker.pid, 6 * GiB), (999_999_999, 2 * GiB)],
            },
            {"name": "NVIDIA L4", "total": 23034 * MiB, "uuid": "GPU-1", "processes": [(worker.pid, GiB)]},
        ]
    )
    machine = Machine("box", (GpuInfo(0, "GPU-0", "L4", 23034 * MiB), GpuInfo(1, "GPU-1", "L4", 23034 * MiB)))
    per_job, external = usage(machine, {"real": job.pid}, nvml=nvml)
    assert per_job == {"real": {0: 6 * GiB, 1: GiB}}
    assert external == {0: 2 * GiB}


def test_graded_response_warns_then_suspends_then_kills_as_time_passes():
    response = GradedResponse(
        ResponseConfig(over_percent=100, suspend_after_seconds=10, kill_after_seconds=30)
    )
    limit, over = 20 * GiB, 30 * GiB
    timeline = {t: response.decide("j", over, limit, now=1000.0 + t) for t in (0, 5, 10, 20, 30, 40)}
    kinds = {t: a.kind if a else None for t, a in timeline.items()}
    assert kinds == {
        0: ActionKind.WARN,
        5: None,
        10: ActionKind.SUSPEND,
        20: None,
        30: ActionKind.KILL,
        40: None,
    }
    assert "30 GiB of its 20 GiB" in timeline[10].reason and timeline[10].over_seconds == 10


def test_dropping_back_under_the_limit_starts_a_new_episode():
    response = GradedResponse(ResponseConfig(suspend_after_seconds=10, kill_after_seconds=None))
    assert response.decide("j", 3, 2, now=0).kind is ActionKind.WARN
    assert response.decide("j", 1, 2, now=5) is None
    assert response.decide("j", 3, 2, now=12).kind is ActionKind.WARN  # the clock restarted at 12
    assert response.decide("j", 3, 2, now=21) is None
    assert response.decide("j", 3, 2, now=22).kind is ActionKind.SUSPEND


def test_a_long_gap_goes_straight_to_the_most_severe_step_and_never_back():
    response = GradedResponse(ResponseConfig(suspend_after_seconds=10, kill_after_seconds=30))
    assert response.decide("j", 3, 2, now=0).kind is ActionKind.WARN
    assert response.decide("j", 3, 2, now=100).kind is ActionKind.KILL
    assert response.decide("j", 3, 2, now=101) is None


def test_over_percent_tolerates_a_margin_and_jobs_without_a_memory_slice_are_never_acted_on():
    response = GradedResponse(ResponseConfig(over_percent=110))
    assert response.decide("j", 21 * GiB, 20 * GiB, now=0) is None  # 105 %: within the margin
    assert response.decide("j", 23 * GiB, 20 * GiB, now=0).kind is ActionKind.WARN
    assert response.decide("whole", 80 * GiB, 0, now=0) is None


def test_forget_clears_a_jobs_history():
    response = GradedResponse()
    response.decide("j", 3, 2, now=0)
    response.forget("j")
    assert response.decide("j", 3, 2, now=1).kind is ActionKind.WARN


def test_bad_response_configs_are_refused():
    with pytest.raises(InvalidRequest):
        ResponseConfig(over_percent=0)
    with pytest.raises(InvalidRequest):
        ResponseConfig(kill_after_seconds=-1)


def test_the_graded_response_applied_to_a_real_job_suspends_and_then_kills_it(tmp_path, groups):
    """The daemon's loop in miniature: read usage, decide, apply through the launcher."""
    machine = discover("pcie-4x-l4")
    spec = JobSpec(
        command=(
            *FAKE_LOAD,
            "--mem",
            "4GiB",
            "--grow-to",
            "9GiB",
            "--grow-seconds",
            "0.5",
            "--seconds",
            "60",
        ),
        gpu_memory_bytes=8 * GiB,
    )
    job = launcher.launch("hog", spec, job_env("soft", spec, (1,), machine, tmp_path), tmp_path)
    groups.append(job.pgid)
    response = GradedResponse(ResponseConfig(suspend_after_seconds=0.3, kill_after_seconds=1.0))
    seen = []
    clock = 0.0

    def step():
        nonlocal clock
        used = sum(usage(machine, {"hog": job.pid})[0]["hog"].values())
        action = response.decide("hog", used, spec.gpu_memory_bytes, now=clock)
        clock += 0.1
        if action is not None:
            seen.append(action.kind)
            {"suspend": launcher.suspend, "kill": launcher.kill}.get(action.kind, lambda pgid: None)(job.pgid)
        return launcher.poll("hog", tmp_path)

    status = wait_for(step, timeout=20, interval=0.05)
    assert seen == [ActionKind.WARN, ActionKind.SUSPEND, ActionKind.KILL]
    assert status.signal == signal.SIGKILL


def test_two_simulated_servers_have_their_own_gpus_and_never_count_each_others_fake_loads(tmp_path, groups):
    mine = discover("pcie-4x-l4", instance=str(tmp_path / "a"))
    other = discover("pcie-4x-l4", instance=str(tmp_path / "b"))
    assert {g.uuid for g in mine.gpus}.isdisjoint(g.uuid for g in other.gpus)
    assert [g.uuid for g in discover("pcie-4x-l4", instance=str(tmp_path / "a")).gpus] == [
        g.uuid for g in mine.gpus
    ]  # the same state dir keeps its GPUs across restarts
    spec = JobSpec(command=(*FAKE_LOAD, "--mem", "3GiB", "--seconds", "60"), gpu_memory_bytes=4 * GiB)
    job = launcher.launch("load", spec, job_env("soft", spec, (1,), mine, tmp_path), tmp_path)
    groups.append(job.pgid)
    wait_for(lambda: usage(mine, {"load": job.pid})[0]["load"], timeout=20)
    assert usage(mine, {"load": job.pid})[0]["load"] == {1: 3 * GiB}
    assert usage(other, {})[1] == {}  # not "others'" memory on the second server's GPU 1
