"""The store: WAL on disk, validated transitions, one transaction per change, state that survives a reopen."""

from __future__ import annotations

import sqlite3

import pytest

from gpuslice.errors import InternalError, InvalidRequest
from gpuslice.server.errors import JobNotFound
from gpuslice.server.store import SCHEMA_VERSION, Store, TenantRecord
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, JobState, Priority, RestartPolicy, TopologyNeed


def _spec(**kw) -> JobSpec:
    return JobSpec(command=("sleep", "1"), **kw)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def test_store_opens_in_wal_mode_with_a_schema_version(store, tmp_path):
    assert store.journal_mode == "wal"
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_a_newer_schema_refuses_to_open_with_a_fix(tmp_path):
    Store(tmp_path / "s.db").close()
    db = sqlite3.connect(tmp_path / "s.db")
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(InvalidRequest, match="upgrade gpuslice or use another --state-dir"):
        Store(tmp_path / "s.db")


def test_submitted_job_is_pending_with_sequential_ids_and_a_submitted_event(store):
    a = store.add_job(_spec(gpus=2, priority=Priority.HIGH, topology=TopologyNeed.NVLINK), now=10.0)
    b = store.add_job(_spec(gpu_memory_bytes=20 * GiB), now=11.0)
    assert (a.id, b.id) == ("1", "2")
    assert a.state is JobState.PENDING and a.submitted_at == 10.0
    assert store.get("1").spec == a.spec
    (_, event), *_ = store.events("1")
    assert event.new_state is JobState.PENDING and event.reason == "submitted"


def test_every_spec_field_round_trips(store):
    spec = JobSpec(
        command=("python", "-c", "print(1)"),
        gpus=1,
        gpu_memory_bytes=8 * GiB,
        compute_percent=50,
        gpu_models=("H100",),
        excluded_gpu_models=("L4",),
        priority=Priority.REALTIME,
        tenant="vision",
        preemptible=False,
        max_runtime_seconds=3600.0,
        restart=RestartPolicy.ON_FAILURE,
        max_restarts=5,
        user="alice",
        cwd="/tmp",
        env=(("A", "1"), ("B", "2")),
    )
    assert store.get(store.add_job(spec, now=1.0).id).spec == spec


def test_transition_sets_fields_and_records_one_event(store):
    job = store.add_job(_spec(), now=1.0)
    running = store.transition(job.id, JobState.RUNNING, "on GPU 3", 2.0, gpus=(3,), pid=42, attempts=1)
    assert (running.state, running.gpus, running.pid, running.attempts) == (JobState.RUNNING, (3,), 42, 1)
    kinds = [(e.old_state, e.new_state, e.reason) for _, e in store.events(job.id)]
    assert kinds[-1] == (JobState.PENDING, JobState.RUNNING, "on GPU 3")


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        pytest.param([], JobState.SUCCEEDED, id="pending cannot succeed"),
        pytest.param([JobState.CANCELLED], JobState.PENDING, id="cancelled is final"),
        pytest.param([JobState.RUNNING], JobState.RUNNING, id="running cannot start again"),
    ],
)
def test_a_forbidden_transition_raises_and_writes_nothing(store, path, bad):
    job = store.add_job(_spec(), now=1.0)
    for state in path:
        store.transition(job.id, state, "ok", 2.0)
    before = (store.get(job.id), store.events(job.id))
    with pytest.raises(InvalidRequest, match="cannot become"):
        store.transition(job.id, bad, "bad", 3.0, pid=99)
    assert (store.get(job.id), store.events(job.id)) == before


def test_a_failure_inside_a_transaction_rolls_back_every_change(store):
    job = store.add_job(_spec(), now=1.0)
    with pytest.raises(RuntimeError), store.transaction():
        store.transition(job.id, JobState.RUNNING, "started", 2.0, pid=7)
        store.add_job(_spec(), now=2.0)
        raise RuntimeError("crash between two writes")
    assert store.get(job.id).state is JobState.PENDING and store.get(job.id).pid is None
    assert [j.id for j in store.jobs()] == ["1"]


def test_fixed_fields_cannot_be_updated(store):
    job = store.add_job(_spec(), now=1.0)
    with pytest.raises(InternalError, match="cannot change after submit"):
        store.update(job.id, spec="{}")


def test_unknown_job_is_not_found_with_a_hint(store):
    with pytest.raises(JobNotFound, match="gpuslice ps"):
        store.get("404")


def test_state_survives_reopen_and_a_writer_killed_mid_transaction(tmp_path):
    path = tmp_path / "state.db"
    first = Store(path)
    job = first.add_job(_spec(), now=1.0)
    first.transition(job.id, JobState.RUNNING, "started", 2.0, pid=5, pgid=5, proc_start_time=1.5)
    # A second connection begins a write and never commits (as if the process died): nothing of it lands.
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("UPDATE jobs SET state = 'FAILED'")
    raw.close()
    first.close()
    again = Store(path)
    back = again.get(job.id)
    assert (back.state, back.pid, back.pgid, back.proc_start_time) == (JobState.RUNNING, 5, 5, 1.5)
    assert again.count(JobState.RUNNING) == 1
    again.close()


def test_jobs_filter_by_state_and_tenant(store):
    a = store.add_job(_spec(tenant="a"), now=1.0)
    store.add_job(_spec(tenant="b"), now=2.0)
    store.transition(a.id, JobState.CANCELLED, "cancelled by user", 3.0)
    assert [j.id for j in store.jobs([JobState.PENDING])] == ["2"]
    assert [j.id for j in store.jobs(tenant="a")] == ["1"]
    assert [j.id for j in store.jobs(newest_first=True, limit=1)] == ["2"]


def test_tenants_upsert(store):
    store.put_tenant(TenantRecord("vision", weight=2.0, max_gpus=4), now=1.0)
    store.put_tenant(TenantRecord("vision", weight=3.0, response={"kill_after_seconds": 5}), now=2.0)
    assert store.tenants()["vision"] == TenantRecord("vision", 3.0, None, None, {"kill_after_seconds": 5})


def test_events_page_after_an_id(store):
    job = store.add_job(_spec(), now=1.0)
    store.event(job.id, "enforcement", "warned", 2.0, {"used": 1})
    first, second = store.events()
    assert [e.kind for _, e in store.events(after_id=first[0])] == ["enforcement"]
    assert second[1].detail == {"used": 1}
