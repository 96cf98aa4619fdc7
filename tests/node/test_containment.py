"""A job ends when its last process has ended, and stopping it stops every process it started, in every
containment mode that works on this machine. The process group (``pgroup``, how jobs were kept before
containers) is run through the same tests, expected to fail: it shows that each test catches the escape."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from node_helpers import PY, wait_for

from escape_jobs import ESCAPER, ESCAPES, MODES, alive, beating, escaper_pid, release, works
from gpuslice.node import containment, launcher
from gpuslice.node.launcher import Containment
from gpuslice.units import MiB
from gpuslice.workload.job import JobSpec


def _limited(name: str) -> list:
    """The modes that enforce host limit ``name`` here, plus pgroup (which cannot: expected to fail)."""
    here = [
        m for m in ("cgroup2", "cgroup1", "systemd") if works(m) and name in containment.limits_supported(m)
    ]
    return [*here, pytest.param("pgroup", marks=ESCAPES)]


@pytest.fixture
def escape(tmp_path, cleanup):
    """escape(mode, kind, seconds, main, grace=1, **spec) -> (launched job, out dir); whatever escaped is
    released after the test."""
    outs: list[Path] = []

    def start(mode: str, kind: str, seconds: float, main: str, grace: float = 1.0, pids_max: int = 0, **spec):
        out = tmp_path / f"out-{len(outs)}"
        out.mkdir()
        outs.append(out)
        command = (PY, "-c", ESCAPER, str(out), kind, str(seconds), main)
        job = launcher.launch(
            "e", JobSpec(command=command, **spec), {}, tmp_path, contain=Containment(mode, grace, pids_max)
        )
        cleanup.append(job.pgid)
        # the job's main process writes its pid after the escaper's: a test that kills at once (a loaded
        # machine's worst moment) must not kill it before it said who it is (a bomb's main writes it only
        # after its forks have slept their ``seconds``)
        says_main = main == "stay" and kind != "bomb"
        wait_for(lambda: escaper_pid(out) and (not says_main or (out / "main").exists()), timeout=30)
        return job, out

    yield start
    for out in outs:
        release(out)


def _end(tmp_path: Path, timeout: float = 30) -> launcher.ExitStatus:
    return wait_for(lambda: launcher.poll("e", tmp_path), timeout=timeout)


@pytest.mark.parametrize("mode", MODES)
def test_a_setsid_daemon_is_killed_after_the_grace_and_the_job_ends_only_then(tmp_path, escape, mode):
    _, out = escape(mode, "setsid", 600, "exit", grace=1.0)
    status = _end(tmp_path)
    assert not alive(escaper_pid(out)), "the job was recorded as ended while its daemon still ran"
    assert (status.exit_code, status.leftovers, status.leftovers_killed) == (0, 1, 1)


@pytest.mark.parametrize("mode", MODES)
def test_a_process_that_outlives_the_main_one_holds_the_job_open_until_it_ends(tmp_path, escape, mode):
    _, out = escape(mode, "setsid", 3, "exit", grace=60.0)  # it ends by itself, well inside the grace
    pid = escaper_pid(out)
    while alive(pid):
        assert launcher.poll("e", tmp_path) is None, "the job ended while a process of it still ran"
        time.sleep(0.1)
    status = _end(tmp_path)
    assert (status.exit_code, status.leftovers, status.leftovers_killed) == (0, 1, 0)


@pytest.mark.parametrize("mode", MODES)
def test_a_double_forked_daemon_does_not_outlive_its_job(tmp_path, escape, mode):
    _, out = escape(mode, "double", 600, "exit", grace=1.0)
    _end(tmp_path)
    assert not alive(escaper_pid(out))


@pytest.mark.parametrize("mode", MODES)
def test_cancel_kills_a_setsid_child_too(tmp_path, escape, mode):
    job, out = escape(mode, "setsid", 600, "stay", grace=1.0)
    assert launcher.terminate(job.pgid, 1.0, tmp_path)
    _end(tmp_path)
    assert not alive(escaper_pid(out)), "cancelled, yet its setsid child runs"
    assert not alive(int((out / "main").read_text()))


@pytest.mark.parametrize("mode", MODES)
def test_cancel_stops_a_process_that_reforks_every_millisecond_and_ignores_sigterm(tmp_path, escape, mode):
    job, out = escape(mode, "refork", 0, "stay", grace=0.5)
    assert beating(out), "the re-forker should run before the cancel"
    assert launcher.terminate(job.pgid, 0.5, tmp_path)
    _end(tmp_path)
    assert not beating(out, seconds=1.5), "the job is recorded as ended, yet its re-forker still runs"


@pytest.mark.parametrize("mode", MODES)
def test_kill_from_the_server_reaches_the_whole_container_even_with_its_supervisor_gone(
    tmp_path, escape, mode
):
    job, out = escape(mode, "setsid", 600, "stay")
    os.kill(job.pid, 9)  # the supervisor dies: the server's kill must still find every process
    wait_for(lambda: not launcher.is_alive(job.pid, job.start_time))
    launcher.kill(job.pgid, tmp_path)
    wait_for(lambda: not alive(escaper_pid(out)), timeout=10)
    wait_for(lambda: not alive(int((out / "main").read_text())), timeout=10)


@pytest.mark.parametrize("mode", _limited("pids"))
def test_a_fork_bomb_is_stopped_by_pids_max(tmp_path, escape, mode):
    job, out = escape(mode, "bomb", 30, "stay", pids_max=16)
    wait_for(lambda: (out / "refused").exists(), timeout=20)  # 128 processes asked, 16 allowed
    launcher.kill(job.pgid, tmp_path)
    _end(tmp_path)


@pytest.mark.parametrize("mode", _limited("memory"))
def test_a_job_over_its_host_memory_is_oom_killed_by_the_kernel(tmp_path, cleanup, mode):
    spec = JobSpec(command=(PY, "-c", "b = b'x' * (400 * 2**20)"), host_memory_bytes=64 * MiB)
    job = launcher.launch("e", spec, {}, tmp_path, contain=Containment(mode, 1.0))
    cleanup.append(job.pgid)
    status = _end(tmp_path)
    assert status.signal == 9 and status.oom_kills >= 1, status


def test_a_host_limit_that_the_mode_cannot_enforce_fails_the_start_saying_why(tmp_path, cleanup):
    spec = JobSpec(command=(PY, "-c", "pass"), host_memory_bytes=64 * MiB)
    job = launcher.launch("e", spec, {}, tmp_path, contain=Containment("subreaper", 1.0))
    cleanup.append(job.pgid)
    status = _end(tmp_path)
    assert status.exit_code == 126
    assert "cannot enforce host limits" in launcher.log_paths(tmp_path, "e")[1].read_text()


@pytest.mark.parametrize("mode", _limited("cpus"))
def test_cpus_become_the_cgroups_cpu_quota(tmp_path, cleanup, mode):
    spec = JobSpec(command=(PY, "-c", "import time; time.sleep(60)"), cpus=0.5)
    job = launcher.launch("e", spec, {}, tmp_path, contain=Containment(mode, 1.0))
    cleanup.append(job.pgid)
    record = wait_for(lambda: (launcher.record_dir(tmp_path, "e") / containment.RECORD_FILE).exists())
    assert record
    data = json.loads((launcher.record_dir(tmp_path, "e") / containment.RECORD_FILE).read_text())
    paths = data["paths"]
    if isinstance(paths, dict):  # v1: cpu.cfs_quota_us over a 100 ms period
        assert (Path(paths["cpu"]) / "cpu.cfs_quota_us").read_text().strip() == "50000"
    else:  # v2: "quota period"
        assert (Path(paths[0]) / "cpu.max").read_text().split() == ["50000", "100000"]
    wait_for(lambda: containment.from_record(data, supervisor_alive=True).members())  # the job is in it
    launcher.kill(job.pgid, tmp_path)
    _end(tmp_path)


def test_systemd_is_refused_where_pid_1_is_not_systemd_saying_so():
    if Path("/proc/1/comm").read_text().strip() == "systemd":
        pytest.skip("systemd is PID 1 here")
    with pytest.raises(containment.ContainmentUnavailable, match="PID 1 is not systemd"):
        containment.detect("systemd")


def test_a_systemd_scope_wraps_the_command_in_systemd_run_with_the_limits():
    """What can be checked without systemd: the systemd-run command line (systemd-run(1)); the scope's
    cgroup itself is not exercised on a machine whose PID 1 is not systemd."""
    scope = containment.from_record({"mode": "systemd", "supervisor": 1, "marker": "7-ab"}, True)
    scope.setup(containment.Limits(memory_bytes=2**30, cpus=1.5, pids_max=64))
    argv = scope.wrap(["python", "train.py"])
    assert argv[0] == "systemd-run" and "--scope" in argv and "--collect" in argv
    assert "--unit=gpuslice-7-ab" in argv
    assert {"MemoryMax=1073741824", "CPUQuota=150%", "TasksMax=64"} <= set(argv)
    assert argv[-3:] == ["--", "python", "train.py"]
    assert ("--user" in argv) == (os.geteuid() != 0)


def test_an_unknown_mode_is_refused_naming_the_known_ones():
    with pytest.raises(containment.ContainmentUnavailable, match="known: auto, cgroup2"):
        containment.detect("docker")


def test_serve_help_says_what_each_mode_guarantees():
    from typer.testing import CliRunner

    from gpuslice.cli.main import app

    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for mode in (*containment.MODES, "--containment", "--pids-max", "last process"):
        assert mode in result.output, mode


def test_a_server_refuses_a_host_limit_its_mode_cannot_enforce_naming_the_field(tmp_path):
    from gpuslice.errors import InvalidRequest
    from gpuslice.node.discovery import discover
    from gpuslice.server.local_node import LocalNode

    node = LocalNode(discover("dgx-h100"), tmp_path, "soft", contain=Containment("subreaper"))
    with pytest.raises(InvalidRequest, match=r"^host_memory_bytes: .*subreaper"):
        node.check_host_limits(JobSpec(command=("x",), host_memory_bytes=MiB))
    node.check_host_limits(JobSpec(command=("x",)))  # none asked: fine
