"""The state file locked by another process, or on a failing disk, in this process (a fake node).

A locked file: every call waits a bounded time, then StoreBusy (503 with Retry-After), and works again
when the other process lets go; /v1/health answers from memory all along. A failing disk ("disk I/O
error", injected here; tests/server/test_serve_store_faults.py makes a real one): StoreFailing (503),
health "degraded" with the reason, and one log line a minute instead of a traceback per call.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
import warnings

import pytest

from gpuslice.server.app import create_app
from gpuslice.server.errors import StoreBusy, StoreFailing
from gpuslice.server.store import DEFAULT_BUSY_SECONDS, Store
from gpuslice.server.store_faults import RateLimitedLog, classify
from gpuslice.workload.job import JobSpec, JobState

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Far above the busy timeout, far below SQLite's old 30 s: a loaded machine passes, the old code fails.
BOUND_SECONDS = 4 * DEFAULT_BUSY_SECONDS + 5


def spec() -> JobSpec:
    return JobSpec(command=("train",), user="u", gpu_memory_bytes=2**30)


@pytest.fixture
def locker(tmp_path):
    """another_process(): a second SQLite connection that holds the state file's write lock."""
    held: list[sqlite3.Connection] = []

    def hold(path) -> sqlite3.Connection:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        held.append(other)
        return other

    yield hold
    for other in held:
        other.close()


class FailingDisk:
    """The store's connection, whose statements fail with "disk I/O error" while ``failing`` is set (what
    SQLite raises when read(2) or write(2) returns EIO)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.failing = False
        self.calls = 0

    def execute(self, sql: str, *args):
        if self.failing and not sql.startswith(("ROLLBACK", "PRAGMA busy_timeout")):
            self.calls += 1
            raise sqlite3.OperationalError("disk I/O error")
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self.db, name)


@pytest.fixture
def failing_disk(daemon, monkeypatch) -> FailingDisk:
    disk = FailingDisk(daemon.store._db)
    monkeypatch.setattr(daemon.store, "_db", disk)
    return disk


def test_a_write_while_another_process_holds_the_lock_is_busy_within_the_bound_then_works(tmp_path, locker):
    store = Store(tmp_path / "state.db")
    try:
        other = locker(tmp_path / "state.db")
        began = time.monotonic()
        with pytest.raises(StoreBusy, match="locked by another process"):
            store.add_job(spec(), 1.0)
        assert time.monotonic() - began < BOUND_SECONDS
        assert store.condition.kind == "busy" and "locked by another process" in store.condition.reason
        assert store.jobs() == []  # nothing half-written; reads still work in WAL mode
        other.rollback()
        assert store.add_job(spec(), 2.0).id == "1"
        assert store.condition.ok
    finally:
        store.close()


def test_a_read_queued_behind_a_waiting_write_waits_a_bounded_time(tmp_path, locker):
    store = Store(tmp_path / "state.db", busy_seconds=1.0)
    try:
        locker(tmp_path / "state.db")
        refused: list[Exception] = []

        def write() -> None:
            try:
                store.add_job(spec(), 1.0)
            except StoreBusy as err:
                refused.append(err)

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.2)  # the write now waits for the lock, holding the store
        began = time.monotonic()
        with contextlib.suppress(StoreBusy):  # it may wait its bound, then say so
            assert store.jobs() == []
        assert time.monotonic() - began < BOUND_SECONDS
        writer.join()
        assert len(refused) == 1
    finally:
        store.close()


def test_the_daemon_survives_a_locked_store_and_goes_on_after_it_is_released(daemon, node, locker, tmp_path):
    daemon.tick_seconds = 0.05
    daemon.start()
    try:
        other = locker(tmp_path / "state.db")
        with pytest.raises(StoreBusy):
            daemon.submit(spec())
        assert daemon.scheduler.queue() == []  # taken back with the rollback
        time.sleep(0.3)  # passes that find the file locked
        assert daemon._thread is not None and daemon._thread.is_alive()
        other.rollback()
        deadline = time.monotonic() + 30
        job = None
        while time.monotonic() < deadline:
            try:
                job = job or daemon.submit(spec())
            except StoreBusy:  # the lock's release is seen at the next try
                time.sleep(0.1)
                continue
            if job.id in node.launched:
                break
            time.sleep(0.05)
        assert job is not None and job.id in node.launched and daemon.store.condition.ok
    finally:
        daemon.stop()


def test_health_answers_from_memory_while_the_store_is_locked(daemon, locker, tmp_path, monkeypatch):
    with TestClient(create_app(daemon, TOKEN), headers=AUTH) as api:
        assert api.post("/v1/jobs", json={"command": ["x"]}).status_code == 201
        daemon.tick()
        locker(tmp_path / "state.db")

        def no_sqlite(*_a, **_k):
            raise AssertionError("/v1/health touched the state file")

        monkeypatch.setattr(daemon.store, "count", no_sqlite)
        monkeypatch.setattr(daemon.store, "counts", no_sqlite)
        began = time.monotonic()
        health = api.get("/v1/health")
        assert time.monotonic() - began < 2 and health.status_code == 200
        assert health.json()["jobs"]["RUNNING"] == 1
        r = api.post("/v1/jobs", json={"command": ["y"]})
        assert r.status_code == 503 and r.json()["type"] == "StoreBusy", r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert api.get("/v1/health").json()["status"] == "degraded"


def test_a_failing_disk_answers_503_and_health_says_degraded_with_the_reason(daemon, failing_disk, caplog):
    with TestClient(create_app(daemon, TOKEN), headers=AUTH) as api:
        assert api.post("/v1/jobs", json={"command": ["x"]}).status_code == 201
        failing_disk.failing = True
        caplog.set_level(logging.WARNING, logger="gpuslice.server")
        answers = [api.post("/v1/jobs", json={"command": ["x"]}) for _ in range(20)]
        answers += [api.get("/v1/jobs") for _ in range(20)]
        assert {r.status_code for r in answers} == {503}, answers[0].text
        assert {r.json()["type"] for r in answers} == {"StoreFailing"}
        assert all(int(r.headers["Retry-After"]) > 0 for r in answers)
        health = api.get("/v1/health")
        assert health.status_code == 200
        assert health.json()["status"] == "degraded" and "disk I/O error" in health.json()["reason"]
        for _ in range(20):  # the daemon's passes probe, fail, and end quietly
            with pytest.raises(StoreFailing):
                daemon.tick()
        assert failing_disk.calls >= 60
        logged = [r for r in caplog.records if r.name == "gpuslice.server"]
        assert len(logged) == 1 and "disk I/O error" in logged[0].getMessage(), logged
        assert not any(r.exc_info for r in logged)  # no traceback
        failing_disk.failing = False
        daemon.tick()  # the probe works: usable again
        assert api.get("/v1/health").json()["status"] == "ok"
        assert api.post("/v1/jobs", json={"command": ["x"]}).status_code == 201


def test_the_failing_log_comes_again_after_a_minute_with_how_many_were_held_back(caplog):
    now = [0.0]
    log = RateLimitedLog(clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="gpuslice.server")
    assert [log.warning("k", "store failing") for _ in range(5)] == [True, False, False, False, False]
    now[0] = 61.0
    assert log.warning("k", "store failing")
    assert [r.getMessage() for r in caplog.records] == [
        "store failing", "store failing (4 more like it in the last 60 s)"]  # fmt: skip


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (sqlite3.OperationalError("database is locked"), StoreBusy),
        (sqlite3.OperationalError("disk I/O error"), StoreFailing),
        (sqlite3.DatabaseError("database disk image is malformed"), StoreFailing),
        (sqlite3.OperationalError("attempt to write a readonly database"), StoreFailing),
        (sqlite3.IntegrityError("UNIQUE constraint failed: jobs.id"), sqlite3.IntegrityError),
    ],
    ids=["locked", "eio", "malformed", "read-only", "constraint: a bug"],
)
def test_sqlite_errors_are_classified(tmp_path, error, kind):
    assert isinstance(classify(error, tmp_path / "x.db"), kind)


def test_every_job_state_is_counted_for_health(daemon):
    daemon.submit(spec())
    daemon.views.publish_counts()
    counts = daemon.views.job_counts
    assert set(counts) == {s.value for s in JobState} and counts["PENDING"] == 1
