"""A job's files are opened only as regular files of ours inside its folder, never through a link: the
ordinary hostile things a job does to its own folder, and a restarted supervisor appending after them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from node_helpers import PY

import gpuslice.node.supervisor as supervisor
from gpuslice.node.private_files import (
    UnsafeFile,
    open_folder,
    open_for_append,
    open_for_reading,
    private_folder,
)

SECRET = "the-server-token\n"


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """state/jobs/1 with a log, beside a 0600 secret standing in for the token and /etc/shadow."""
    folder = tmp_path / "state" / "jobs" / "1"
    folder.mkdir(parents=True, mode=0o700)
    secret = tmp_path / "state" / "token"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    return folder


def _swap(folder: Path, name: str, kind: str) -> None:
    """What a hostile job does to its log ``name``: put a link, a hard link or a FIFO in its place."""
    log = folder / name
    log.unlink(missing_ok=True)
    token = folder.parent.parent / "token"
    if kind == "link to the token":
        log.symlink_to("../../token")
    elif kind == "absolute link":
        log.symlink_to(token)
    elif kind == "link to another job's log":
        other = folder.parent / "2"
        other.mkdir(mode=0o700, exist_ok=True)
        (other / "stdout.log").write_text(SECRET)
        log.symlink_to(other / "stdout.log")
    elif kind == "hard link to the token":
        os.link(token, log)
    elif kind == "fifo":
        os.mkfifo(log)
    else:
        raise AssertionError(kind)


KINDS = ["link to the token", "absolute link", "link to another job's log", "hard link to the token", "fifo"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_log_swapped_by_the_job_is_refused_for_reading_and_nothing_outside_is_read(job, kind):
    _swap(job, "stdout.log", kind)
    with pytest.raises(UnsafeFile) as refused:
        open_for_reading(job / "stdout.log")  # a FIFO must not block here either
    assert "stdout.log" in str(refused.value)


def test_a_regular_log_reads_and_a_missing_one_is_none(job):
    (job / "stdout.log").write_bytes(b"hello\n")
    with open_for_reading(job / "stdout.log") as f:
        assert f.read() == b"hello\n"
    assert open_for_reading(job / "stderr.log") is None
    assert open_for_reading(job.parent / "9" / "stdout.log") is None


@pytest.mark.parametrize("kind", ["link", "group-writable"])
def test_a_job_folder_swapped_for_a_link_or_opened_to_others_is_refused(job, tmp_path, kind):
    if kind == "link":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        (elsewhere / "stdout.log").write_text(SECRET)
        job.rename(tmp_path / "old")
        job.symlink_to(elsewhere)
    else:
        (job / "stdout.log").write_text("mine\n")
        job.chmod(0o770)
    with pytest.raises(UnsafeFile):
        open_for_reading(job / "stdout.log")
    with pytest.raises(UnsafeFile):
        open_for_append(job / "stdout.log")


@pytest.mark.parametrize("kind", KINDS)
def test_appending_replaces_a_swapped_log_and_leaves_its_target_alone(job, kind):
    _swap(job, "stdout.log", kind)
    token = job.parent.parent / "token"
    fd = open_for_append(job / "stdout.log")
    try:
        os.write(fd, b"second attempt\n")
    finally:
        os.close(fd)
    assert token.read_text() == SECRET
    if kind == "link to another job's log":
        assert (job.parent / "2" / "stdout.log").read_text() == SECRET
    log = job / "stdout.log"
    assert not log.is_symlink() and log.stat().st_nlink == 1 and (log.stat().st_mode & 0o777) == 0o600
    first, second = log.read_text().splitlines()
    assert first.startswith("gpuslice: ") and "replaced by this new file" in first
    assert second == "second attempt"


def test_supervisor_restart_does_not_append_to_what_the_job_linked_its_logs_to(job):
    """Attempt 1 swaps both logs for links to the token and fails; attempt 2 (the restart, a new
    supervisor over the same folder, run by path as the launcher runs it) writes its output."""
    token = job.parent.parent / "token"
    swap = "import os; [os.unlink(n) or os.symlink('../../token', n) for n in ('stdout.log', 'stderr.log')]"
    second = "import sys; print('out'); print('err', file=sys.stderr)"
    for attempt, code in enumerate([swap + "; raise SystemExit(1)", second]):
        subprocess.run(
            [PY, "-I", supervisor.__file__, "--job-dir", str(job), "--cwd", str(job),
             "--attempt", str(attempt), "--", sys.executable, "-c", code],
            timeout=30, start_new_session=True, check=False,
        )  # fmt: skip
    assert json.loads((job / supervisor.EXIT_FILE).read_text())["exit_code"] == 0
    assert token.read_text() == SECRET
    assert (job / "stdout.log").read_text().splitlines()[-1] == "out"
    assert (job / "stderr.log").read_text().splitlines()[-1] == "err"


def test_open_folder_refuses_a_file_and_a_link(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path)
    for name in ("file", "link"):
        with pytest.raises(UnsafeFile):
            open_folder(tmp_path / name)


def test_private_folder_is_made_0700_and_refuses_a_squatted_one(tmp_path):
    made = private_folder(tmp_path / "a" / "b")
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700
    open_to_all = tmp_path / "squatted"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(UnsafeFile, match="writable by group or others"):
        private_folder(open_to_all)
    (tmp_path / "linked").symlink_to(made)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        private_folder(tmp_path / "linked")


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
def test_private_folder_refuses_another_users_folder(tmp_path):
    import pwd

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(UnsafeFile, match="belongs to user id"):
        private_folder(theirs)


def test_a_relaunch_writes_nothing_through_links_the_last_attempt_left(tmp_path):
    """The launcher's own supervisor.log: a link in its place is replaced, its target left alone; a job
    folder swapped for a link is refused before anything in it is removed."""
    from node_helpers import python_job, wait_for

    from gpuslice.node import launcher

    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (outside / "supervisor.log").write_text(SECRET)
    (outside / launcher.REPORT_FILE).write_text("{}")
    folder = launcher.job_dir(tmp_path, "j1")
    folder.mkdir(parents=True, mode=0o700)
    (folder / "supervisor.log").symlink_to(outside / "supervisor.log")
    launcher.launch("j1", python_job("pass"), {}, tmp_path, attempt=1)
    wait_for(lambda: launcher.poll("j1", tmp_path))
    assert (outside / "supervisor.log").read_text() == SECRET
    assert not (folder / "supervisor.log").is_symlink()

    folder.rename(tmp_path / "old")
    folder.symlink_to(outside)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        launcher.launch("j1", python_job("pass"), {}, tmp_path, attempt=2)
    assert (outside / launcher.REPORT_FILE).exists()


@pytest.mark.parametrize("kind", ["fifo", "link to the token"])
def test_a_fake_load_report_that_is_a_fifo_or_a_link_does_not_stall_or_feed_the_monitor(tmp_path, kind):
    """Any process named like a fake load may point GPUSLICE_REPORT_FILE anywhere: a FIFO used to block
    the daemon's monitor pass for ever, a link made it read the token."""
    import threading

    from gpuslice.node.discovery import discover
    from gpuslice.node.monitor import usage

    report = tmp_path / "report.json"
    if kind == "fifo":
        os.mkfifo(report)
    else:
        report.symlink_to(tmp_path / "token")
    env = {**os.environ, "GPUSLICE_REPORT_FILE": str(report)}
    impostor = subprocess.Popen(["bash", "-c", "exec -a gpuslice-fake-load sleep 60"], env=env)
    # a file that would pass for its report (its PID, one byte on GPU 0) where the link points
    (tmp_path / "token").write_text(json.dumps({"pid": impostor.pid, "memory_bytes": {"0": 1}}))
    try:
        from node_helpers import wait_for

        wait_for(lambda: "fake-load" in " ".join(__import__("psutil").Process(impostor.pid).cmdline()))
        result: list[object] = []
        worker = threading.Thread(target=lambda: result.append(usage(discover("dgx-h100"), {})), daemon=True)
        worker.start()
        worker.join(timeout=20)
        assert result, "the monitor's pass did not return: it is blocked on the report"
        _, external = result[0]
        assert external.get(0) != 1, "the monitor read the report through the link"
    finally:
        impostor.kill()
        impostor.wait()
        if kind == "fifo":
            with contextlib.suppress(OSError):  # a reader left blocked on the FIFO (old code) is freed
                os.close(os.open(report, os.O_WRONLY | os.O_NONBLOCK))
