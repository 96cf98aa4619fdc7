"""``gpuslice serve`` as a real process under a machine's faults: a damaged or lost state file, a job
that lies about its end, SIGTERM with log followers attached.

Every case ends with the same checks: the server says what happened in one line, no job is lost or run
twice, no id or job folder is reused.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent



def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def test_a_garbage_state_file_is_refused_with_one_line_and_the_way_out(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "gpuslice.db").write_bytes(b"this is not a database" * 100)
    result = subprocess.run(
        [str(BIN / "gpuslice"), "serve", "--simulate", "dgx-h100", "--state-dir", str(state), "--port", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: state file"), result.stderr
    assert "is damaged" in lines[0] and "mv " in lines[0] and "Traceback" not in result.stderr


def test_a_deleted_state_file_reuses_no_id_and_adopts_the_running_job(serve):
    first = serve()
    ended = first.submit(sh("echo done"))
    first.wait(lambda: first.jobs()[ended["id"]]["state"] == "SUCCEEDED", 60, "the first job to end")
    running = first.submit(sh("echo run; sleep 300"))
    first.wait(lambda: first.jobs()[running["id"]]["pid"] is not None, 60, "the job to start")
    pid = first.jobs()[running["id"]]["pid"]
    first.kill9()
    for name in ("gpuslice.db", "gpuslice.db-wal", "gpuslice.db-shm"):
        (first.state_dir / name).unlink(missing_ok=True)
    second = serve(state_dir=first.state_dir)
    jobs = second.jobs()
    assert jobs[running["id"]]["state"] == "RUNNING" and jobs[running["id"]]["pid"] == pid
    assert ended["id"] not in jobs  # ended while unknown to the store: not restored
    assert "knows less than the job records" in second.log
    fresh = second.submit(sh("echo new"))
    assert int(fresh["id"]) > int(running["id"])  # no job folder is reused
    r = second.http.post(f"/v1/jobs/{running['id']}/cancel", headers=second.auth)
    assert r.status_code == 200, r.text
    second.wait(lambda: second.jobs()[running["id"]]["state"] == "CANCELLED", 60, "the cancel")


def test_a_deleted_wal_after_kill_9_does_not_start_a_running_job_twice(serve):
    first = serve()
    job = first.submit(sh("echo run; sleep 300"))
    first.wait(lambda: first.jobs()[job["id"]]["pid"] is not None, 60, "the job to start")
    pid = first.jobs()[job["id"]]["pid"]
    first.kill9()
    db = first.state_dir / "gpuslice.db"
    # what a WAL lost after the submit leaves: the job as it was stored before it started
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE jobs SET state='PENDING', attempts=0, pid=NULL, gpus='[]' WHERE id=?",
                     (job["id"],))
    second = serve(state_dir=first.state_dir)
    after = second.jobs()[job["id"]]
    assert (after["state"], after["pid"], after["attempts"]) == ("RUNNING", pid, 1)
    time.sleep(1)  # a pass or more: still the one process
    assert second.jobs()[job["id"]]["pid"] == pid


def test_one_unreadable_row_does_not_break_the_job_list(serve):
    first = serve()
    good = first.submit(sh("echo ok"))
    bad = first.submit(sh("echo bad"), gpus=8)
    first.wait(lambda: first.jobs()[good["id"]]["state"] == "SUCCEEDED", 60, "the good job")
    first.kill9()
    with sqlite3.connect(first.state_dir / "gpuslice.db") as conn:
        conn.execute("UPDATE jobs SET spec='{not json', state='PENDING' WHERE id=?", (bad["id"],))
    second = serve(state_dir=first.state_dir)
    listed = second.http.get("/v1/jobs")
    assert listed.status_code == 200 and [j["id"] for j in listed.json()] == [good["id"]]
    one = second.http.get(f"/v1/jobs/{bad['id']}")
    assert one.status_code == 409 and "cannot be read" in one.json()["detail"]
    later = second.submit(sh("echo later"))
    second.wait(lambda: second.jobs()[later["id"]]["state"] == "SUCCEEDED", 60, "a job after it")


def test_a_job_forging_its_exit_record_keeps_running_until_it_really_ends(serve):
    forge = (
        'printf \'{"exit_code": 0, "signal": null, "finished_at": 9e9, "started_at": 9e9, "attempt": 1}\' '
        '| tee "$GPUSLICE_JOB_DIR/exit.json" > "$GPUSLICE_JOB_DIR/../../records/$GPUSLICE_JOB_ID/exit.json"; '
        "echo forged; sleep 3; exit 7"
    )
    server = serve()
    liar = server.submit(sh(forge), gpus=8)
    waiting = server.submit(sh("echo next"), gpus=8)
    log = server.state_dir / "jobs" / liar["id"] / "stdout.log"
    server.wait(lambda: log.exists() and "forged" in log.read_text(), 60, "the forgery")
    time.sleep(1)
    jobs = server.jobs()
    assert jobs[liar["id"]]["state"] == "RUNNING" and jobs[waiting["id"]]["state"] == "PENDING"
    server.wait(lambda: server.jobs()[liar["id"]]["state"] == "FAILED", 60, "its real end")
    assert server.jobs()[liar["id"]]["exit_code"] == 7


def test_sigterm_ends_the_server_within_its_grace_while_logs_are_followed(serve):
    server = serve()
    job = server.submit(sh("echo run; sleep 300"))
    server.wait(lambda: server.jobs()[job["id"]]["pid"] is not None, 60, "the job to start")
    clients = []
    for _ in range(5):
        c = httpx.Client(base_url=server.url, headers=server.auth, timeout=30)
        stream = c.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": "true"})
        stream.__enter__()
        clients.append((c, stream))
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0, server.log
    # the followers ended at the signal: the grace did not have to run out on them
    assert "timeout graceful shutdown exceeded" not in server.log
    for c, stream in clients:
        stream.__exit__(None, None, None)
        c.close()
    again = serve(state_dir=server.state_dir)  # the job outlived the server and is adopted
    assert again.jobs()[job["id"]]["state"] == "RUNNING"
    r = again.http.post(f"/v1/jobs/{job['id']}/cancel", headers=again.auth)  # its container, its cgroup too
    assert r.status_code == 200, r.text
    again.wait(lambda: again.jobs()[job["id"]]["state"] == "CANCELLED", 30, "the cancel")


def test_a_second_sigterm_cuts_the_grace_short(serve):
    """A request still under way (its body arrives slowly) holds the shutdown for the grace; a second
    SIGTERM ends it at once."""
    import socket

    server = serve()
    slow = socket.create_connection(("127.0.0.1", server.port))
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {server.token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")  # fmt: skip
    slow.sendall(head.encode())
    time.sleep(0.5)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert server.proc.poll() is None  # the grace holds it
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0, server.log
    # it ended the wait for the held request, rather than the grace running out (uvicorn says so then)
    assert "timeout graceful shutdown exceeded" not in server.log
    slow.close()


def test_idle_unauthenticated_connections_are_closed_and_a_huge_head_is_refused_unread(serve):
    import socket

    import psutil

    server = serve()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
    dribble = socket.create_connection(("127.0.0.1", server.port))
    dribble.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes its head
    for s in [*idle, dribble]:
        s.settimeout(30)
    started = time.monotonic()
    assert all(s.recv(1024) == b"" for s in idle)  # closed by the server, not by us
    assert dribble.recv(1024) == b""
    assert time.monotonic() - started < 20  # the idle time (5 s), with room for a loaded machine
    for s in [*idle, dribble]:
        s.close()
    assert server.proc is not None
    before = psutil.Process(server.proc.pid).memory_info().rss
    big = socket.create_connection(("127.0.0.1", server.port))
    big.settimeout(30)
    big.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ")
    sent = 0
    with contextlib.suppress(OSError):  # the server answers and closes long before 64 MiB
        while sent < 64 * 2**20:
            big.sendall(b"a" * 2**20)
            sent += 2**20
    answer = b""
    with contextlib.suppress(OSError):
        answer = big.recv(1024)
    big.close()
    assert sent < 64 * 2**20 or answer.startswith(b"HTTP/1.1 4"), answer
    assert psutil.Process(server.proc.pid).memory_info().rss - before < 32 * 2**20
    assert server.http.get("/v1/health").status_code == 200
