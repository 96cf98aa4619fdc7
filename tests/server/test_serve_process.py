"""A real ``gpuslice serve --simulate dgx-h100`` process: signals, file modes, lost supervisors and log
followers, where only a real process, a real socket and real job processes show the defect."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.server.run import secure_state_dir

pytestmark = pytest.mark.slow


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def group(pgid: int) -> list[int]:
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                members.append(p.pid)
    return members


def test_sigterm_stops_the_server_cleanly(serve):
    server = serve()
    assert (server.state_dir / "gpuslice.db-wal").exists()  # the store is open
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0, server.log  # not -15: the clean-up ran to its end
    # Store.close ran: SQLite checkpoints and removes the WAL when the last connection closes.
    assert not (server.state_dir / "gpuslice.db-wal").exists()


def test_every_file_in_the_state_dir_is_private(serve, tmp_path):
    state = tmp_path / "state"
    (state / "jobs" / "old").mkdir(parents=True)
    (state / "notes").write_text("made by hand")
    for path, m in (
        (state, 0o755),
        (state / "jobs", 0o755),
        (state / "jobs" / "old", 0o755),
        (state / "notes", 0o644),
    ):
        os.chmod(path, m)
    previous = os.umask(0o022)  # the usual umask, which makes 0644 files unless a mode is given
    try:
        server = serve(state_dir=state)
        job = server.submit(["sh", "-c", "echo hello; echo oops >&2"])
        server.wait(lambda: server.jobs()[job["id"]]["state"] == "SUCCEEDED", 30, "the job to end")
    finally:
        os.umask(previous)
    job_dir = state / "jobs" / job["id"]
    assert {
        p.name: mode(p) for p in (state, state / "jobs", job_dir, state / "jobs" / "old")
    } == dict.fromkeys((state.name, "jobs", job["id"], "old"), 0o700)
    files = ["notes", "token", "server.lock", "gpuslice.db", "gpuslice.db-wal", "gpuslice.db-shm"]
    files += [f"jobs/{job['id']}/{name}" for name in ("supervisor.log", "stdout.log", "stderr.log")]
    files += [f"records/{job['id']}/{name}" for name in ("exit.json", "job.json")]
    assert mode(state / "records" / job["id"]) == 0o700
    assert {name: oct(mode(state / name)) for name in files} == {name: "0o600" for name in files}


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder owned by another user needs root")
def test_a_state_dir_of_another_user_is_refused(tmp_path):
    other = tmp_path / "theirs"
    other.mkdir(mode=0o755)
    os.chown(other, 65534, 65534)
    with pytest.raises(InvalidRequest, match="belongs to user id 65534"):
        secure_state_dir(other)
    assert mode(other) == 0o755  # refused, not touched


def test_a_killed_supervisor_takes_its_job_with_it_before_a_restart(serve):
    server = serve("--grace", "1s")
    job = server.submit(["sh", "-c", "sleep 300 & wait"], restart="on-failure", max_restarts=1)
    server.wait(lambda: server.jobs()[job["id"]]["pid"] is not None, 30, "the job to start")
    first = server.jobs()[job["id"]]
    server.wait(lambda: len(group(first["pid"])) >= 3, 30, "sh and sleep")  # the supervisor leads the group
    os.kill(first["pid"], signal.SIGKILL)  # the supervisor only; sh and sleep live on in its group
    server.wait(lambda: server.jobs()[job["id"]]["attempts"] == 2, 30, "the restart")
    assert group(first["pid"]) == []  # attempt 1's processes were killed before attempt 2 started
    events = server.http.get("/v1/events", params={"job_id": job["id"]}).json()
    assert any("supervisor died" in e["reason"] for e in events)


def test_a_hundred_log_followers_leave_the_api_answering(serve):
    server = serve("--grace", "1s")
    job = server.submit(["sleep", "300"])  # silent: its followers wait, and wait
    server.wait(lambda: server.jobs()[job["id"]]["state"] == "RUNNING", 30, "the job to start")
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    with httpx.Client(
        base_url=server.url, headers=server.http.headers, limits=limits, timeout=30
    ) as followers:
        with contextlib.ExitStack() as stack:
            for _ in range(100):
                r = stack.enter_context(followers.stream("GET", f"/v1/jobs/{job['id']}/logs?follow=true"))
                assert r.status_code == 200
            # Before, 40 followers held all 40 worker threads and every other call waited for the job to end.
            assert server.http.get("/v1/health", timeout=30).status_code == 200
            assert server.http.get("/v1/jobs", timeout=30).status_code == 200
            other = server.submit(["true"])
            assert server.http.get("/metrics", timeout=30).status_code == 200
        # the followers hung up; the server answers as before
        assert server.http.get(f"/v1/jobs/{other['id']}", timeout=30).status_code == 200
    r = server.http.post(f"/v1/jobs/{job['id']}/cancel", headers=server.auth, timeout=30)
    assert r.status_code == 200


def test_serve_prints_a_sign_in_link_and_refuses_foreign_hosts(serve):
    server = serve()
    link = server.sign_in_url
    assert link.startswith(server.url + "/?token=") and server.token not in link
    anonymous = httpx.Client(base_url=server.url, follow_redirects=False)
    with anonymous:
        assert anonymous.get("/v1/jobs").status_code == 401
        r = anonymous.get(link)
        assert r.status_code == 303
        assert anonymous.get("/v1/jobs").status_code == 200  # the cookie
        assert anonymous.get("/v1/health", headers={"Host": "attacker.example"}).status_code == 400
        assert anonymous.get(f"http://localhost:{server.port}/v1/health").status_code == 200
    with pytest.raises(subprocess.TimeoutExpired):
        server.proc.wait(timeout=0.1)  # still serving after all that


def test_the_cli_clients_read_with_the_token_from_the_state_dir(serve):
    bin_dir = Path(sys.executable).parent  # the venv of this test run

    server = serve()
    # runs until the fixture kills it: six CLI starts on a loaded machine can take over a minute
    job = server.submit(["sleep", "3600"])
    where = ["--url", server.url, "--state-dir", str(server.state_dir)]
    for args in (["ps", "-a"], ["show", job["id"]], ["top", "--once"], ["queue"], ["gpus"]):
        done = subprocess.run(
            [str(bin_dir / "gpuslice"), *args, *where], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    env = {**os.environ, "GPUSLICE_STATE_DIR": str(server.state_dir), "COLUMNS": "200"}
    top = subprocess.run([str(bin_dir / "gpuslice"), "top", "--once", "--url", server.url], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert top.returncode == 0 and "sleep 3600" in top.stdout, top.stderr
