"""job_env: the variables that confine a job (formats of the CUDA and MPS docs),
and MpsDaemon's clear error when the MPS control program is missing."""

from __future__ import annotations

import os
import shutil
import stat
from types import SimpleNamespace

import pytest
from node_helpers import fake_pynvml

from gpuslice.errors import InternalError, InvalidRequest
from gpuslice.node.discovery import discover
from gpuslice.node.enforcement import (
    MpsDaemon,
    MpsUnavailable,
    SharingMode,
    job_env,
    mig_device_uuid,
    mps_dirs,
    mps_memory_limit,
)
from gpuslice.units import GiB, MiB
from gpuslice.workload.job import JobSpec, Priority

CMD = ("python", "train.py")


@pytest.fixture(scope="module")
def dgx():
    return discover("dgx-h100")


def test_mps_memory_limit_names_each_device_with_a_size_and_unit():
    assert mps_memory_limit(["GPU-a", "GPU-b"], 12 * GiB) == "GPU-a=12288M,GPU-b=12288M"
    assert mps_memory_limit(["GPU-a"], 12 * GiB + 5) == "GPU-a=12288M"  # rounded down: never above the slice


def test_whole_gpus_get_their_uuids_and_the_whole_memory(tmp_path, dgx):
    env = job_env(
        "soft", JobSpec(command=CMD, gpus=2, priority=Priority.HIGH, tenant="vision"), (1, 3), dgx, tmp_path
    )
    assert env["CUDA_VISIBLE_DEVICES"] == f"{dgx.gpus[1].uuid},{dgx.gpus[3].uuid}"
    assert env["CUDA_VISIBLE_DEVICES"].startswith("GPU-sim-")
    assert env["GPUSLICE_GPUS"] == "1,3"
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(dgx.gpus[1].memory_bytes)
    assert env["GPUSLICE_COMPUTE_PERCENT"] == "100"
    assert (env["GPUSLICE_TENANT"], env["GPUSLICE_PRIORITY"], env["GPUSLICE_SHARING"]) == (
        "vision",
        "high",
        "soft",
    )
    assert "PYTHONPATH" not in env and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


def test_a_job_without_gpus_sees_none(tmp_path, dgx):
    env = job_env("mps", JobSpec(command=CMD, gpus=0), (), dgx, tmp_path)
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_mps_share_gets_thread_percentage_pinned_memory_and_the_daemon_dirs(tmp_path, dgx):
    spec = JobSpec(command=CMD, gpus=1, gpu_memory_bytes=20 * GiB, compute_percent=30)
    env = job_env(SharingMode.MPS, spec, (2,), dgx, tmp_path)
    pipe, log = mps_dirs(tmp_path)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{dgx.gpus[2].uuid}=20480M"
    assert (env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"]) == (str(pipe), str(log))
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(20 * GiB)
    assert env["GPUSLICE_COMPUTE_PERCENT"] == "30"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == pytest.approx(
        20 * GiB / dgx.gpus[2].memory_bytes, 1e-3
    )
    assert "PYTHONPATH" not in env


def test_mps_compute_only_share_sets_no_memory_limit(tmp_path, dgx):
    env = job_env("mps", JobSpec(command=CMD, compute_percent=50), (0,), dgx, tmp_path)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


def test_soft_share_puts_the_cap_directory_on_pythonpath(tmp_path, dgx):
    env = job_env("soft", JobSpec(command=CMD, gpu_memory_bytes=8 * GiB), (0,), dgx, tmp_path)
    assert (tmp_path / "softcap" / "sitecustomize.py").is_file()
    assert env["PYTHONPATH"] == str((tmp_path / "softcap").resolve())
    assert env["GPUSLICE_SOFT_CAP"] == "1"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env


def test_a_deep_state_dir_gets_a_short_mps_pipe_dir(tmp_path):
    deep = tmp_path / ("d" * 90)
    pipe, log = mps_dirs(deep)
    assert len(str(pipe)) <= 100 and pipe.parent == log.parent
    assert mps_dirs(deep) == (pipe, log)  # the same every time: server and jobs agree
    shutil.rmtree(pipe.parent)  # made outside tmp_path (a short name under the temp dir)


def test_mig_job_sees_its_mig_device_and_the_instance_memory(tmp_path):
    machine = discover("dgx-a100:mig")
    mig = SimpleNamespace(gpu=1, profile="3g.40gb", start=4)
    env = job_env("mig", JobSpec(command=CMD, mig_profile="3g.40gb"), (1,), machine, tmp_path, mig=mig)
    assert env["CUDA_VISIBLE_DEVICES"] == mig_device_uuid(machine, 1, "3g.40gb", 4)
    assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert int(env["GPUSLICE_GPU_MEMORY_BYTES"]) == 40192 * MiB
    assert env["GPUSLICE_MIG_PROFILE"] == "3g.40gb"


def test_a_real_mig_uuid_is_looked_up_by_profile_and_start_through_nvml(tmp_path):
    nvml = fake_pynvml(
        [
            {
                "name": "NVIDIA A100-SXM4-80GB",
                "total": 80 * GiB,
                "uuid": "GPU-real",
                "mig": 1,
                "mig_devices": [("MIG-first", 9, 0), ("MIG-second", 9, 4)],
            }
        ]
    )
    machine = discover(nvml=nvml)
    assert mig_device_uuid(machine, 0, "3g.40gb", 4, nvml=nvml) == "MIG-second"


@pytest.mark.parametrize(
    ("name", "mode", "spec", "gpus", "error"),
    [
        ("unknown mode", "hami", JobSpec(command=CMD), (0,), InvalidRequest),
        ("GPU not on the machine", "soft", JobSpec(command=CMD), (9,), InternalError),
        (
            "MIG profile without an instance",
            "mig",
            JobSpec(command=CMD, mig_profile="1g.10gb"),
            (0,),
            InternalError,
        ),
    ],
)
def test_impossible_requests_are_refused(tmp_path, dgx, name, mode, spec, gpus, error):
    with pytest.raises(error):
        job_env(mode, spec, gpus, dgx, tmp_path)


def test_mps_daemon_without_the_control_program_says_what_to_do(tmp_path):
    daemon = MpsDaemon(tmp_path, binary="nvidia-cuda-mps-control-not-here")
    with pytest.raises(MpsUnavailable, match="--sharing soft"):
        daemon.start()
    assert not daemon.is_running()
    daemon.stop()  # stopping a daemon that never ran is a no-op


def test_mps_daemon_drives_the_control_program_with_our_pipe_dir(tmp_path, monkeypatch):
    """A stand-in control program: ``-d`` creates the control pipe, ``quit`` removes it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "nvidia-cuda-mps-control"
    program.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-d" ]; then mkdir -p "$CUDA_MPS_PIPE_DIRECTORY"; '
        ': > "$CUDA_MPS_PIPE_DIRECTORY/control"; '
        'echo started >> "$CUDA_MPS_LOG_DIRECTORY/control.log"; exit 0; fi\n'
        "read cmd\n"
        'if [ "$cmd" = "quit" ]; then rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"; fi\n'
        "exit 0\n"
    )
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with MpsDaemon(tmp_path / "state") as daemon:
        assert daemon.is_running()
        assert (daemon.log_dir / "control.log").read_text() == "started\n"
    assert not daemon.is_running()


def test_shim_share_preloads_the_library_and_finds_the_fake_driver_on_a_simulated_machine(tmp_path, dgx):
    from gpuslice.shim import fake_driver_dir, library_path

    spec = JobSpec(command=CMD, gpus=1, gpu_memory_bytes=20 * GiB, compute_percent=30, priority=Priority.LOW)
    env = job_env(SharingMode.SHIM, spec, (5,), dgx, tmp_path)
    assert env["LD_PRELOAD"] == str(library_path())
    assert env["GPUSLICE_SHIM_DIR"] == str((tmp_path / "shim").resolve()) and (tmp_path / "shim").is_dir()
    assert env["GPUSLICE_SHIM_GPU_REGION"] == str((tmp_path / "shim" / "gpus.region").resolve())
    assert (env["GPUSLICE_GPUS"], env["GPUSLICE_GPU_MEMORY_BYTES"]) == ("5", str(20 * GiB))
    assert (env["GPUSLICE_COMPUTE_PERCENT"], env["GPUSLICE_PRIORITY"]) == ("30", "low")
    assert env["LD_LIBRARY_PATH"] == str(fake_driver_dir())  # a simulated machine has no libcuda
    assert env["FAKE_CUDA_MEMORY_BYTES"] == str(dgx.gpus[5].memory_bytes)
    assert env["FAKE_CUDA_UUIDS"] == dgx.gpus[5].uuid


def test_shim_mode_leaves_whole_gpu_jobs_unwrapped(tmp_path, dgx):
    env = job_env(SharingMode.SHIM, JobSpec(command=CMD, gpus=2), (0, 1), dgx, tmp_path)
    assert "LD_PRELOAD" not in env and "GPUSLICE_SHIM_DIR" not in env
