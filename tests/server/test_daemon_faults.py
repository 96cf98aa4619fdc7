"""The daemon under a machine's faults, in this process (a fake node): a full disk at a submit, a job
whose files lie or are damaged, a launch short of file descriptors, a crash before a launch.

Each test breaks one thing the way a machine does and checks that the store and the scheduler agree
afterwards and that no other job is held up.
"""

from __future__ import annotations

import errno
import os
import sqlite3

import pytest

from gpuslice.errors import InternalError
from gpuslice.node.launcher import ExitStatus
from gpuslice.server.errors import StoreFull
from gpuslice.workload.job import JobSpec, JobState, RestartPolicy


def whole_machine(**kw) -> JobSpec:
    return JobSpec(command=("train",), user="u", gpus=8, **kw)


def _disk_full(*_a, **_k):
    raise sqlite3.OperationalError("database or disk is full")


def test_a_submit_whose_commit_fails_leaves_no_phantom_in_the_scheduler(daemon, monkeypatch):
    """The idempotency key is the last write of a submit: when the disk fills there, the job must leave
    the scheduler's queue with the store's rollback, or it holds the GPUs and its id is refused forever."""
    monkeypatch.setattr(daemon.store, "remember_key", _disk_full)
    with pytest.raises(StoreFull, match=r"disk .* is full"):
        daemon.submit_once(whole_machine(), ("key-1", "digest"))
    assert daemon.store.jobs() == [] and daemon.scheduler.queue() == []
    monkeypatch.undo()
    job, created = daemon.submit_once(whole_machine(), ("key-1", "digest"))  # the same id is free again
    assert created and job.id == "1"
    daemon.tick()
    assert daemon.store.get(job.id).state is JobState.RUNNING  # no phantom holds the 8 GPUs


def test_a_full_disk_when_storing_running_leaves_the_job_queued_in_both(daemon, node, monkeypatch):
    job = daemon.submit(whole_machine())
    real = daemon.store.transition
    monkeypatch.setattr(daemon.store, "transition", _disk_full)
    daemon.tick()  # the RUNNING cannot be stored: the scheduler must not keep the job placed
    assert node.launched == {} and daemon.store.get(job.id).state is JobState.PENDING
    monkeypatch.setattr(daemon.store, "transition", real)
    daemon.tick()
    assert daemon.store.get(job.id).state is JobState.RUNNING and job.id in node.launched


def test_a_store_that_cannot_commit_is_usable_again_once_there_is_room(tmp_path):
    """SQLite keeps a transaction whose COMMIT failed open; the store must end it, or every later
    BEGIN fails. A page limit is SQLite's own disk-full (SQLITE_FULL), raised at the write."""
    from gpuslice.server.store import Store

    store = Store(tmp_path / "s.db")
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StoreFull):
        for _ in range(200):
            store.add_job(JobSpec(command=("x" * 2000,), user="u"), 1.0)
    kept = len(store.jobs())
    store._db.execute("PRAGMA max_page_count = 1000000")
    job = store.add_job(JobSpec(command=("after",), user="u"), 2.0)
    assert len(store.jobs()) == kept + 1 and job.spec.command == ("after",)
    store.close()


def test_a_job_cannot_end_its_record_while_its_supervisor_runs(daemon, node):
    """A record that says "ended" (a job wrote it, with a later start) is not believed while the
    supervisor lives: the job keeps its GPUs, nothing else starts on them."""
    liar = daemon.submit(whole_machine())
    daemon.tick()
    node.exits[liar.id] = ExitStatus(0, None, 1e12, started_at=1e12)  # the supervisor is still alive
    nxt = daemon.submit(whole_machine())
    daemon.tick()
    assert daemon.store.get(liar.id).state is JobState.RUNNING
    assert daemon.store.get(nxt.id).state is JobState.PENDING
    node.exit(liar.id, code=7)  # now it really ends
    daemon.tick()
    assert (daemon.store.get(liar.id).state, daemon.store.get(liar.id).exit_code) == (JobState.FAILED, 7)


def test_a_record_of_another_attempt_is_ignored_by_its_number(daemon, node):
    job = daemon.submit(whole_machine(restart=RestartPolicy.ON_FAILURE, max_restarts=2))
    daemon.tick()
    node.exits[job.id] = ExitStatus(0, None, 5.0, started_at=5.0, attempt=0)  # attempt 0 never ran
    node.alive.clear()
    daemon.tick()
    after = daemon.store.get(job.id)  # not "exited 0": lost, requeued by its policy, started again
    assert after.state is JobState.RUNNING and after.attempts == 2 and after.exit_code is None
    assert "lost: its supervisor died without an exit record" in _reasons(daemon, job.id)


def _reasons(daemon, job_id: str) -> str:
    return " | ".join(e.reason for _, e in daemon.store.events(job_id))


def test_a_malformed_exit_record_ends_that_job_and_not_the_pass(daemon, node, monkeypatch):
    bad = daemon.submit(JobSpec(command=("train",), user="u"))
    good = daemon.submit(JobSpec(command=("train",), user="u"))
    daemon.tick()
    real = node.poll

    def poll(job_id, state_dir):
        if job_id == bad.id:
            raise InternalError("exit.json is not a valid exit record (Expecting value)")
        return real(job_id, state_dir)

    monkeypatch.setattr(node, "poll", poll)
    node.alive.discard(node.launched[bad.id].pid)
    node.exit(good.id, code=0)
    waiting = daemon.submit(whole_machine())
    daemon.tick()
    assert daemon.store.get(good.id).state is JobState.SUCCEEDED
    broken = daemon.store.get(bad.id)
    assert broken.state is JobState.FAILED and "not a valid exit record" in broken.reason
    daemon.tick()  # both GPUs are free again: the pass went on to start the next job
    assert daemon.store.get(waiting.id).state is JobState.RUNNING


def test_a_launch_out_of_file_descriptors_waits_instead_of_failing(daemon, node):
    job = daemon.submit(JobSpec(command=("train",), user="u"))
    node.launch_errors[job.id] = OSError(errno.EMFILE, "Too many open files")
    daemon.tick()
    queued = daemon.store.get(job.id)
    assert queued.state is JobState.PENDING and queued.attempts == 0 and queued.gpus == ()
    assert "could not start yet (Too many open files)" in queued.reason
    daemon.tick()
    assert daemon.store.get(job.id).state is JobState.RUNNING and daemon.store.get(job.id).attempts == 1


def test_a_job_stored_running_but_never_launched_runs_after_a_restart(make_daemon, node):
    """kill -9 between storing RUNNING and launching: a `restart: never` job that never ran must not
    end FAILED; it goes back to the queue, no attempt counted."""
    first = make_daemon()
    job = first.submit(JobSpec(command=("train",), user="u", restart=RestartPolicy.NEVER))
    first.tick()
    first.store.update(job.id, pid=None, pgid=None, proc_start_time=None)  # as if never launched
    node.started.discard(job.id)
    node.alive.clear()
    second = make_daemon()  # the restart
    report = second.recover()
    back = second.store.get(job.id)
    assert back.state is JobState.PENDING and back.attempts == 0 and job.id not in report.lost
    second.tick()
    assert second.store.get(job.id).state is JobState.RUNNING


def test_a_supervisor_that_started_and_vanished_is_still_lost(daemon, node):
    job = daemon.submit(JobSpec(command=("train",), user="u", restart=RestartPolicy.NEVER))
    daemon.tick()
    daemon.store.update(job.id, pid=None, pgid=None, proc_start_time=None)
    node.alive.clear()  # it started (its reservation is there) and died without a record
    daemon.tick()
    after = daemon.store.get(job.id)
    assert after.state is JobState.FAILED and "lost" in after.reason


def test_mig_instances_are_reported_as_instances_not_whole_gpus(make_daemon):
    from gpuslice.hardware.machine import GpuInfo, Machine
    from gpuslice.units import GiB

    machine = Machine("a100-mig", (GpuInfo(0, "GPU-0", "A100-80GB", 80 * GiB, True, "a100-80gb"),))
    daemon = make_daemon(machine=machine)
    jobs = [daemon.submit(JobSpec(command=("train",), user="u", mig_profile="1g.10gb")) for _ in range(4)]
    daemon.tick()
    assert all(daemon.store.get(j.id).state is JobState.RUNNING for j in jobs)
    [gpu] = daemon.views.gpus()
    assert [j["mig"] for j in gpu["jobs"]] == ["1g.10gb"] * 4
    assert all(j["memory_bytes"] < 12 * GiB and j["compute_percent"] == 14 for j in gpu["jobs"])
    allocated = daemon.views.snapshot().gpus[0].memory_allocated_bytes
    assert allocated <= 80 * GiB and allocated == sum(j["memory_bytes"] for j in gpu["jobs"])


def test_a_request_with_two_host_headers_is_refused_whichever_comes_last():
    import asyncio
    import json

    from gpuslice.server.guard import Guard

    sent: list[dict] = []

    async def app(scope, receive, send):  # pragma: no cover - must not be reached
        raise AssertionError("the request passed the guard")

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    guard = Guard(app, token="t", sign_in_token="once", hosts={"127.0.0.1", "localhost"})
    hosts = [(b"host", b"evil.example"), (b"host", b"127.0.0.1")]
    scope = {"type": "http", "method": "GET", "path": "/v1/health", "query_string": b"",
             "server": ("127.0.0.1", 8787), "headers": hosts}  # fmt: skip
    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 400 and json.loads(sent[1]["body"])["type"] == "HostNotAllowed"


def test_the_softcap_and_shim_folders_are_private(tmp_path):
    from gpuslice.node import enforcement

    previous = os.umask(0o022)
    try:
        folders = [enforcement.softcap_dir(tmp_path), enforcement.shim_dir(tmp_path)]
    finally:
        os.umask(previous)
    assert [oct(f.stat().st_mode & 0o777) for f in folders] == ["0o700", "0o700"]
    assert oct((folders[0] / "sitecustomize.py").stat().st_mode & 0o777) == "0o600"


def test_after_a_500_the_connection_still_serves_the_next_request(daemon, monkeypatch):
    """A bug answers 500 as JSON and leaves the keep-alive connection open (a client pool, a proxy)."""
    import json
    import socket
    import threading
    import time

    import uvicorn
    from server_helpers import free_port

    from gpuslice.server.app import create_app

    port = free_port()
    config = uvicorn.Config(create_app(daemon, "t"), port=port, http="h11", log_level="critical")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        real = daemon.store.jobs
        monkeypatch.setattr(daemon.store, "jobs", lambda *a, **k: 1 / 0)  # a bug behind /v1/jobs
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            ask = b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer t\r\n\r\n"
            conn.sendall(ask)
            first = conn.recv(65536)
            assert first.startswith(b"HTTP/1.1 500") and b'"type":"ZeroDivisionError"' in first
            monkeypatch.setattr(daemon.store, "jobs", real)
            conn.sendall(ask)
            second = conn.recv(65536)
            assert second.startswith(b"HTTP/1.1 200"), second
            assert json.loads(second.split(b"\r\n\r\n", 1)[1]) == []
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_wall_clock_step_forward_does_not_end_a_job_at_its_max_runtime(daemon, node, clock):
    job = daemon.submit(JobSpec(command=("train",), user="u", max_runtime_seconds=600))
    daemon.tick()
    start = node.launched[job.id].start_time
    node.ran[start] = 30.0  # its process has run 30 s by the boot clock
    clock.now += 3600  # the wall clock steps an hour ahead
    daemon.tick()
    assert daemon.store.get(job.id).stop == "" and node.signals == []
    node.ran[start] = 601.0  # now it really ran past its limit
    daemon.tick()
    assert daemon.store.get(job.id).stop == "limit"
