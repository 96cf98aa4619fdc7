"""The launcher and the supervisor under a machine's faults, with real processes: the wall clock steps,
the disk fills, a job writes an exit record of its own.

The clock and disk tests run in a mount namespace of their own (``unshare --mount``, root only): the
clock step is a copy of /proc/stat with a shifted ``btime`` bind-mounted over it (what psutil and every
boot-time reader sees after an NTP step or a VM resume), the full disk a small tmpfs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap

import pytest
from node_helpers import PY, python_job, wait_for

from gpuslice.node import launcher
from gpuslice.node import supervisor as supervisor_module


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


needs_namespace = pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare --mount")


def _in_namespace(script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@needs_namespace
@pytest.mark.parametrize("shift", [3600, -3600, 2])
def test_a_wall_clock_step_does_not_make_a_running_job_look_dead(tmp_path, cleanup, shift):
    job = launcher.launch("clock", python_job("import time; time.sleep(60)"), {}, tmp_path)
    cleanup.append(job.pgid)
    check = (f"import psutil; from gpuslice.node import launcher; "
             f"print(launcher.is_alive({job.pid}, {job.start_time!r}), "
             f"psutil.Process({job.pid}).create_time())")  # fmt: skip
    stat = tmp_path / "stat"
    result = _in_namespace(
        f"awk '/^btime/{{$2=$2+({shift})}}1' /proc/stat > {stat} && mount --bind {stat} /proc/stat && "
        f"{PY} -c '{check}'"
    )
    assert result.returncode == 0, result.stderr
    alive, shifted_create_time = result.stdout.split()
    import psutil

    assert abs(float(shifted_create_time) - psutil.Process(job.pid).create_time() - shift) < 1  # it stepped
    assert alive == "True"
    launcher.kill(job.pgid)  # the job, then its supervisor records the exit and removes its cgroup
    wait_for(lambda: not launcher.is_alive(job.pid, job.start_time))


def test_an_older_record_of_the_start_as_a_create_time_still_counts():
    import psutil

    me = psutil.Process()
    assert launcher.is_alive(me.pid, me.create_time())
    assert not launcher.is_alive(me.pid, me.create_time() - 3600)
    assert launcher.is_alive(me.pid, launcher.process_start(me.pid) or -1)
    assert not launcher.is_alive(me.pid, (launcher.process_start(me.pid) or 0) - 1)


def _supervise_on_a_full_disk(tmp_path, job_script: str, before: str = "") -> dict:
    """Run the supervisor with its folders on a 256 KiB tmpfs; ``before`` runs first (e.g. fills it)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    sup = supervisor_module.__file__
    script = textwrap.dedent(f"""
        set -e
        mount -t tmpfs -o size=256k tmpfs {mnt}
        mkdir -p {mnt}/job {mnt}/rec
        {before}
        {PY} -I {sup} --job-dir {mnt}/job --record-dir {mnt}/rec --attempt 1 -- sh -c '{job_script}' || true
        cat {mnt}/rec/exit.json
    """)
    result = _in_namespace(script)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@needs_namespace
def test_a_job_that_fills_the_disk_and_exits_0_is_recorded_as_exited_0(tmp_path):
    """The exit record's space is taken before the job runs, so a job that fills the disk still ends
    with its true exit code (not lost, and so not run again by `restart: on-failure`)."""
    record = _supervise_on_a_full_disk(tmp_path, f"cat /dev/zero > {tmp_path}/mnt/fill 2>/dev/null; exit 0")
    assert (record["exit_code"], record["signal"], record["attempt"]) == (0, None, 1)


@needs_namespace
def test_a_disk_full_from_the_start_delays_the_exit_record_until_there_is_room(tmp_path):
    """No room even for the reservation: the supervisor lives on, retrying, until space is freed."""
    fill = f"{tmp_path}/mnt/fill"
    record = _supervise_on_a_full_disk(
        tmp_path, "exit 3", before=f"cat /dev/zero > {fill} 2>/dev/null || true; (sleep 2; rm {fill}) &"
    )
    assert record["exit_code"] == 3


def test_a_job_writing_exit_json_in_its_folder_does_not_end_its_record(tmp_path, cleanup):
    code = textwrap.dedent("""
        import json, os, time
        forged = {"exit_code": 0, "signal": None, "finished_at": time.time() + 99,
                  "started_at": time.time() + 99}
        with open(os.path.join(os.environ["GPUSLICE_JOB_DIR"], "exit.json"), "w") as f:
            json.dump(forged, f)
        print("forged", flush=True)
        time.sleep(60)
    """)
    job = launcher.launch("liar", python_job(code), {}, tmp_path, attempt=1)
    cleanup.append(job.pgid)
    out, _ = launcher.log_paths(tmp_path, "liar")
    wait_for(lambda: out.exists() and "forged" in out.read_text(), timeout=30)
    assert launcher.poll("liar", tmp_path) is None  # the job's folder is not where records are read
    assert launcher.is_alive(job.pid, job.start_time) and launcher.was_started("liar", tmp_path)
    launcher.kill(job.pgid)
    status = wait_for(lambda: launcher.poll("liar", tmp_path), timeout=30)
    assert (status.signal, status.attempt) == (signal.SIGKILL, 1)


def test_seconds_since_a_process_start_reads_the_boot_clock():
    start = launcher.process_start(os.getpid())
    assert start is not None
    ran = launcher.seconds_since(start)
    assert ran is not None and 0 <= ran < 24 * 3600 * 365
    import psutil

    assert launcher.seconds_since(psutil.Process().create_time()) is None  # an epoch value: not ours
