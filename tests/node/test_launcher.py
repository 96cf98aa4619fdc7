"""launch / poll / is_alive / terminate / suspend / resume / kill against real child processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
import time
from functools import partial
from pathlib import Path

import psutil
import pytest
from node_helpers import PY, python_job, wait_for

from gpuslice.errors import InternalError
from gpuslice.node import launcher
from gpuslice.node.launcher import LaunchedJob
from job_cleanup import end_job

# A job that says it is ready, then sleeps; with IGNORE_TERM it ignores SIGTERM (needs the SIGKILL).
SLEEPER = textwrap.dedent("""
    import os, signal, sys, time
    if os.environ.get("IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("ready", os.getpid(), flush=True)
    time.sleep(60)
""")


def started(state_dir, job_id):
    out, _ = launcher.log_paths(state_dir, job_id)
    return out.exists() and "ready" in out.read_text()


def job_pid(state_dir, job_id) -> int:
    out, _ = launcher.log_paths(state_dir, job_id)
    return int(out.read_text().split()[1])


def test_launch_runs_the_command_and_poll_reads_its_exit(tmp_path, cleanup):
    before = time.time()
    job = launcher.launch("j1", python_job("import sys; print('out'); sys.exit(4)"), {}, tmp_path, attempt=3)
    cleanup.append(job.pgid)
    assert isinstance(job, LaunchedJob) and job.pid == job.pgid
    status = wait_for(lambda: launcher.poll("j1", tmp_path))
    assert (status.exit_code, status.signal, status.attempt) == (4, None, 3)
    assert status.containment in ("cgroup2", "cgroup1", "systemd", "subreaper")  # the best one here
    # the supervisor's start time tells this run's record from an earlier run's
    assert status.started_at is not None and before <= status.started_at <= status.finished_at
    assert not status.succeeded
    assert launcher.log_paths(tmp_path, "j1")[0].read_text() == "out\n"
    wait_for(lambda: not launcher.is_alive(job.pid, job.start_time))  # reaped: no zombie counts as alive


def test_the_job_gets_gpuslice_variables_and_env_pythonpath_goes_first(tmp_path, cleanup, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/server/path")
    spec = python_job(
        "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith(('GPUSLICE', 'CUDA', 'PYTHONPATH', 'MINE', 'LD_PRELOAD'))}))",
        env=(("MINE", "user"), ("CUDA_VISIBLE_DEVICES", "user-choice"), ("LD_PRELOAD", "/user/libmine.so")),
    )
    env = {"CUDA_VISIBLE_DEVICES": "GPU-1", "PYTHONPATH": "/softcap", "LD_PRELOAD": "/lib/libc.so.6"}
    cleanup.append(launcher.launch("env-job", spec, env, tmp_path).pgid)
    wait_for(lambda: launcher.poll("env-job", tmp_path))
    seen = json.loads(launcher.log_paths(tmp_path, "env-job")[0].read_text())
    directory = tmp_path / "jobs" / "env-job"
    assert seen["CUDA_VISIBLE_DEVICES"] == "GPU-1"  # gpuslice's value wins over the user's
    assert seen["MINE"] == "user"
    assert seen["PYTHONPATH"] == "/softcap" + os.pathsep + "/server/path"
    assert seen["LD_PRELOAD"] == "/lib/libc.so.6:/user/libmine.so"  # the shim first, the job's own kept
    assert seen["GPUSLICE_JOB_ID"] == "env-job"
    assert seen["GPUSLICE_REPORT_FILE"] == str(directory / launcher.REPORT_FILE)


def test_a_relaunch_of_the_same_job_id_forgets_the_previous_exit(tmp_path, cleanup):
    cleanup.append(launcher.launch("again", python_job("pass"), {}, tmp_path).pgid)
    wait_for(lambda: launcher.poll("again", tmp_path))
    job = launcher.launch("again", python_job(SLEEPER), {}, tmp_path)
    cleanup.append(job.pgid)
    assert launcher.poll("again", tmp_path) is None
    launcher.kill(job.pgid)


def test_is_alive_is_false_for_a_reused_pid_with_another_start_time():
    me = psutil.Process()
    assert launcher.is_alive(me.pid, me.create_time())
    assert not launcher.is_alive(me.pid, me.create_time() - 3600)  # same PID, different process
    assert not launcher.is_alive(2**22 + 12345, me.create_time())  # beyond pid_max: no such process


def test_terminate_sends_sigterm_and_a_well_behaved_job_ends_at_once(tmp_path, cleanup):
    job = launcher.launch("t1", python_job(SLEEPER), {}, tmp_path)
    cleanup.append(job.pgid)
    wait_for(lambda: started(tmp_path, "t1"))
    began = time.monotonic()
    assert launcher.terminate(job.pgid, grace_seconds=30)
    status = wait_for(lambda: launcher.poll("t1", tmp_path))
    assert status.exit_code == 0 and time.monotonic() - began < 5


def test_a_job_stopped_during_supervisor_start_up_is_recorded_as_signalled_not_lost(tmp_path, cleanup):
    # SIGTERM right after launch, while the supervisor's interpreter is still starting: the launcher
    # starts it with the signal blocked, so the stop is delivered to its handler instead of killing it.
    job = launcher.launch("early", python_job(SLEEPER), {}, tmp_path)
    cleanup.append(job.pgid)
    assert launcher.terminate(job.pgid, grace_seconds=5)
    status = wait_for(lambda: launcher.poll("early", tmp_path), timeout=15)
    assert status.exit_code in (0, 128 + signal.SIGTERM)  # the job ran its handler, or died of SIGTERM
    assert not launcher.is_alive(job.pid, job.start_time) or wait_for(
        lambda: not launcher.is_alive(job.pid, job.start_time)
    )


def test_launch_leaves_the_callers_signal_mask_as_it_was(tmp_path, cleanup):
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    job = launcher.launch("mask", python_job("print('hi')"), {}, tmp_path)
    cleanup.append(job.pgid)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    assert wait_for(lambda: launcher.poll("mask", tmp_path)).exit_code == 0


def test_terminate_kills_a_job_that_ignores_sigterm_after_the_grace_period(tmp_path, cleanup):
    spec = python_job(SLEEPER, env=(("IGNORE_TERM", "1"),))
    job = launcher.launch("t2", spec, {}, tmp_path)
    cleanup.append(job.pgid)
    wait_for(lambda: started(tmp_path, "t2"))
    began = time.monotonic()
    launcher.terminate(job.pgid, grace_seconds=1.0)
    time.sleep(0.5)
    assert launcher.poll("t2", tmp_path) is None  # still inside the grace period
    status = wait_for(lambda: launcher.poll("t2", tmp_path), timeout=10)
    assert (status.exit_code, status.signal) == (128 + 9, 9)
    assert time.monotonic() - began >= 1.0


def _frozen(pid: int) -> bool:
    """Stopped by SIGSTOP, or in a frozen cgroup (v2 cgroup.events, v1 freezer.state)."""
    if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
        return True
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and path != "/":
            events = Path(
                "/sys/fs/cgroup/unified" if Path("/sys/fs/cgroup/unified").is_dir() else "/sys/fs/cgroup"
            )
            with contextlib.suppress(OSError):
                if "frozen 1" in (events / path.lstrip("/") / "cgroup.events").read_text():
                    return True
        if controllers == "freezer" and path != "/":
            with contextlib.suppress(OSError):
                if (
                    Path("/sys/fs/cgroup/freezer") / path.lstrip("/") / "freezer.state"
                ).read_text().strip() == "FROZEN":
                    return True
    return False


def test_suspend_stops_the_job_but_not_its_supervisor_and_resume_continues_it(tmp_path, cleanup):
    job = launcher.launch("s1", python_job(SLEEPER), {}, tmp_path)
    cleanup.append(job.pgid)
    wait_for(lambda: started(tmp_path, "s1"))
    worker = job_pid(tmp_path, "s1")
    assert launcher.suspend(job.pgid)
    wait_for(lambda: _frozen(worker))
    assert not _frozen(job.pid)
    assert launcher.resume(job.pgid)
    wait_for(lambda: not _frozen(worker))


def test_a_suspended_job_still_gets_its_sigterm_when_terminated(tmp_path, cleanup):
    job = launcher.launch("s2", python_job(SLEEPER), {}, tmp_path)
    cleanup.append(job.pgid)
    wait_for(lambda: started(tmp_path, "s2"))
    launcher.suspend(job.pgid)
    launcher.terminate(job.pgid, grace_seconds=30)
    status = wait_for(lambda: launcher.poll("s2", tmp_path))
    assert status.exit_code == 0  # SIGCONT after the forwarded SIGTERM let its handler run


def test_kill_kills_every_process_of_the_job_and_the_supervisor_records_it(tmp_path, cleanup):
    code = (
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        + SLEEPER
    )
    job = launcher.launch("k1", python_job(code), {}, tmp_path)
    cleanup.append(job.pgid)
    wait_for(lambda: started(tmp_path, "k1"))
    grandchildren = psutil.Process(job_pid(tmp_path, "k1")).children()
    assert len(grandchildren) == 1
    assert launcher.kill(job.pgid)
    status = wait_for(lambda: launcher.poll("k1", tmp_path))
    assert status.signal == 9
    wait_for(lambda: not grandchildren[0].is_running() or grandchildren[0].status() == psutil.STATUS_ZOMBIE)


def test_a_kill_as_the_supervisor_forks_the_job_still_ends_it_at_once(tmp_path, cleanup):
    """The job's first process is forked before it enters its container; a kill that lands in that
    window must not miss it (the job would run on, for an hour here, holding its GPUs)."""
    for job_id in (f"early{attempt}" for attempt in range(12)):
        supervisor = launcher.launch(job_id, python_job("import time; time.sleep(3600)"), {}, tmp_path)
        cleanup.append(supervisor.pgid)
        # forked, but maybe not inside its container yet
        wait_for(psutil.Process(supervisor.pid).children, interval=0.0005)
        launcher.kill(supervisor.pgid)
        status = wait_for(partial(launcher.poll, job_id, tmp_path), timeout=60)
        assert status.signal == 9


def test_processes_left_behind_when_the_command_ends_are_cleaned_up(tmp_path, cleanup):
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('ready', p.pid, flush=True)\n"
    )
    job = launcher.launch("left", python_job(code), {}, tmp_path)
    cleanup.append(job.pgid)
    wait_for(lambda: launcher.poll("left", tmp_path))
    leftover = job_pid(tmp_path, "left")
    assert not psutil.pid_exists(leftover) or psutil.Process(leftover).status() == psutil.STATUS_ZOMBIE


def test_signalling_a_group_that_is_gone_reports_false():
    gone = subprocess.Popen([PY, "-c", "pass"], start_new_session=True)
    gone.wait()
    assert not launcher.kill(gone.pid)
    assert not launcher.resume(gone.pid)
    assert not launcher.terminate(gone.pid, 1.0)


def test_the_job_survives_the_server_being_killed_and_its_exit_is_recorded(tmp_path):
    server = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from gpuslice.node import launcher
        from gpuslice.workload.job import JobSpec
        job = launcher.launch("orphan", JobSpec(command=({PY!r}, "-c", "import time; time.sleep(1.5)")), {{}},
                              Path({str(tmp_path)!r}))
        print(job.pgid, flush=True)
        import time; time.sleep(60)
    """)
    with subprocess.Popen([PY, "-c", server], stdout=subprocess.PIPE, text=True) as proc:
        pgid = int(proc.stdout.readline())
        proc.kill()  # kill -9 the "server"
    try:
        status = wait_for(lambda: launcher.poll("orphan", tmp_path), timeout=15)
        assert status.succeeded
    finally:
        end_job(pgid, tmp_path)


def test_a_job_id_that_is_not_a_file_name_is_refused(tmp_path):
    with pytest.raises(InternalError, match="cannot name a directory"):
        launcher.job_dir(tmp_path, "../escape")


def test_a_damaged_exit_record_is_an_internal_error_naming_the_file(tmp_path):
    directory = launcher.record_dir(tmp_path, "bad")
    directory.mkdir(parents=True)
    (directory / "exit.json").write_text("{not json")
    with pytest.raises(InternalError, match=r"exit\.json"):
        launcher.poll("bad", tmp_path)
