"""The server's durable state: one SQLite file in WAL mode. Jobs, their events, tenants and quotas.

The store is the truth after a crash: the daemon writes every decision here *before* acting on it where
acting is irreversible (a job is RUNNING with its GPUs before its process is launched), so a restart can
always tell what happened. Each change is one transaction: a state change and its event commit together
or not at all, and a transition the job model forbids (``check_transition``) raises before anything is
written.

Schema (version in ``schema_version``; a newer file than this code refuses to open):

```text
jobs     seq PK, id, spec JSON, state, reason, user, tenant, priority, submitted_at, started_at,
         finished_at, gpus JSON, mig JSON, pid, pgid, proc_start_time, exit_code, exit_signal, attempts,
         stop ("" | preempt | cancel | limit | enforce), stop_deadline, suspended
events   id PK, job_id, time, kind, old_state, new_state, reason, detail JSON
tenants  name PK, weight, max_gpus, max_gpu_memory_bytes, response JSON (graded-response settings)
idempotency  key PK, digest (of the submit body), job_id: a retried submit finds its job
gpu_health   gpu PK, uuid, healthy, reason, kind, since: marks that outlive a restart
```
The last two tables came after version 1 and are created when missing, so an older file opens as is.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuslice.errors import InternalError, InvalidRequest, UserError
from gpuslice.server.codec import spec_from_json, spec_to_json
from gpuslice.server.errors import JobConflict, JobDamaged, JobNotFound, StoreFailing, StoreFull
from gpuslice.server.store_faults import StoreCondition, classify, opening_error, queue_busy
from gpuslice.workload.job import JobEvent, JobSpec, JobState, check_transition

__all__ = ["DEFAULT_BUSY_SECONDS", "SCHEMA_VERSION", "JobRecord", "Store", "StoreFull", "TenantRecord"]

SCHEMA_VERSION = 1
DEFAULT_BUSY_SECONDS = 2.0  # the longest wait for a lock, then StoreBusy (503): the client retries
_log = logging.getLogger("gpuslice.server")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    user TEXT NOT NULL,
    tenant TEXT NOT NULL,
    priority INTEGER NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    gpus TEXT NOT NULL DEFAULT '[]',
    mig TEXT,
    pid INTEGER,
    pgid INTEGER,
    proc_start_time REAL,
    exit_code INTEGER,
    exit_signal INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    stop TEXT NOT NULL DEFAULT '',
    stop_deadline REAL,
    suspended INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    old_state TEXT,
    new_state TEXT,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_job ON events (job_id);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    job_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS gpu_health (
    gpu INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL,
    healthy INTEGER NOT NULL,
    reason TEXT NOT NULL,
    kind TEXT NOT NULL,
    since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY,
    weight REAL NOT NULL DEFAULT 1.0,
    max_gpus REAL,
    max_gpu_memory_bytes INTEGER,
    response TEXT NOT NULL DEFAULT '{}'
);
"""

# Fields the daemon may set alongside (or without) a state change; everything else is fixed at submit.
_MUTABLE = frozenset(
    {
        "started_at", "finished_at", "gpus", "mig", "pid", "pgid", "proc_start_time", "exit_code",
        "exit_signal", "attempts", "stop", "stop_deadline", "suspended", "reason",
    }
)  # fmt: skip
_JSON_FIELDS = frozenset({"gpus", "mig"})


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as stored: its spec plus everything the daemon has learned about it."""

    id: str
    seq: int
    spec: JobSpec
    state: JobState
    reason: str
    user: str
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    gpus: tuple[int, ...] = ()
    mig: dict[str, Any] | None = None  # {"gpu": int, "profile": str, "start": int}
    pid: int | None = None  # the supervisor's PID (leader of the job's process group)
    pgid: int | None = None
    proc_start_time: float | None = None  # launcher.process_start of pid (since boot): no PID reuse fools it
    exit_code: int | None = None
    exit_signal: int | None = None
    attempts: int = 0  # launches so far
    stop: str = ""  # why the daemon is stopping a running job: preempt | cancel | limit | enforce
    stop_deadline: float | None = None  # SIGKILL at this time if it is still alive
    suspended: bool = False


@dataclass(frozen=True, slots=True)
class TenantRecord:
    """A tenant's share and quotas; None means no limit. ``response`` holds graded-response settings."""

    name: str
    weight: float = 1.0
    max_gpus: float | None = None
    max_gpu_memory_bytes: int | None = None
    response: dict[str, Any] = field(default_factory=dict)


class Store:
    """SQLite under ``path`` in WAL mode. Thread-safe: one connection behind one lock. A call waits at
    most ``busy_seconds`` for that lock and as long for SQLite's (another process's write), then raises
    StoreBusy; a failing disk raises StoreFailing; ``condition`` keeps the last in memory (store_faults)."""

    def __init__(self, path: Path | str, busy_seconds: float = DEFAULT_BUSY_SECONDS) -> None:
        self.path = Path(path)
        self.busy_seconds = busy_seconds
        self.condition = StoreCondition()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # 0600 before SQLite opens it: SQLite gives the -wal and -shm files the database file's mode.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        os.chmod(self.path, 0o600)
        self._lock = threading.RLock()
        self._depth = 0
        self._undo: list[Callable[[], None]] = []  # what to take back elsewhere if this one rolls back
        self._damaged: set[int] = set()  # rows already reported as unreadable
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a transaction is exactly what we say.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                   timeout=busy_seconds)  # fmt: skip
        self._db.row_factory = sqlite3.Row
        try:
            self._open()
        except (sqlite3.DatabaseError, StoreFailing) as err:
            self._db.close()
            raise opening_error(err, self.path) from None

    def _open(self) -> None:
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise InternalError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
        # NORMAL is durable against a killed process (the WAL is in the OS cache); only a power cut may
        # lose the last commits, which the exit files then recover.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        # executescript commits on its own; every statement is IF NOT EXISTS, so a rerun is harmless.
        self._db.executescript(_SCHEMA)
        with self.transaction():
            row = self._db.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                self._db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] > SCHEMA_VERSION:
                raise InvalidRequest(
                    f"state file {self.path} has schema {row[0]}, newer than this gpuslice "
                    f"({SCHEMA_VERSION}); upgrade gpuslice or use another --state-dir"
                )

    def close(self) -> None:
        with self._lock:  # closing waits as long as it must
            self._db.close()

    @property
    def journal_mode(self) -> str:
        with self._locked():
            return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic change; nested uses join the outermost. An exception rolls everything back, and so
        does a COMMIT that fails (a full disk): then the ``on_rollback`` actions run, newest first, and
        the error is raised (StoreFull for a full disk)."""
        with self._locked():
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.DatabaseError as err:
                raise self._failed(err) from err
            self._depth = 1
            try:
                yield
                self._db.execute("COMMIT")
                self.condition.worked()
            except BaseException as err:
                # SQLite keeps a transaction whose COMMIT failed open: end it, or every later BEGIN fails
                with suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                undo, self._undo = self._undo, []
                for action in reversed(undo):
                    action()
                if isinstance(err, sqlite3.DatabaseError):
                    raise self._failed(err) from err
                raise
            finally:
                self._depth = 0
                self._undo = []

    def probe(self) -> None:
        """One page written, waiting for nobody: "ok" again if it commits, else StoreBusy/StoreFailing."""
        with self._locked():
            self._db.execute("PRAGMA busy_timeout = 0")
            try:
                with self.transaction():  # a changed byte (SQLite skips a write that changes none): the
                    # header's user_version, which gpuslice does not use otherwise, counts the probes
                    n = self._db.execute("PRAGMA user_version").fetchone()[0]
                    self._db.execute(f"PRAGMA user_version = {(int(n) + 1) % 2**31}")
            finally:
                with suppress(sqlite3.Error):
                    self._db.execute(f"PRAGMA busy_timeout = {int(self.busy_seconds * 1000)}")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The lock, waited for at most ``busy_seconds``; SQLite's errors under it classified."""
        if not self._lock.acquire(timeout=self.busy_seconds):  # this server's own calls queue: not the file
            raise queue_busy(self.busy_seconds)
        try:
            yield
        except sqlite3.DatabaseError as err:
            if self._depth:  # within a transaction, which classifies it as it rolls back
                raise
            raise self._failed(err) from err
        finally:
            self._lock.release()

    def _failed(self, err: sqlite3.DatabaseError) -> Exception:
        self.condition.failed(error := classify(err, self.path))
        return error

    def on_rollback(self, action: Callable[[], None]) -> None:
        """Run ``action`` if the transaction under way does not commit: what was changed outside the
        store along with it (the scheduler's queue) is taken back, so the two change together or not."""
        with self._lock:  # within a transaction: already held
            if not self._depth:
                raise InternalError("on_rollback outside a transaction")
            self._undo.append(action)

    # -- jobs ---------------------------------------------------------------------------------------

    def add_job(self, spec: JobSpec, now: float, reason: str = "submitted") -> JobRecord:
        """Insert a PENDING job and its "submitted" event; the id is the next sequence number."""
        with self.transaction():
            cur = self._db.execute(
                "INSERT INTO jobs (id, spec, state, reason, user, tenant, priority, submitted_at) "
                "VALUES ('', ?, ?, ?, ?, ?, ?, ?)",
                (
                    json.dumps(spec_to_json(spec)),
                    JobState.PENDING.value,
                    reason,
                    spec.user,
                    spec.tenant,
                    int(spec.priority),
                    now,
                ),
            )
            seq = int(cur.lastrowid or 0)
            job_id = str(seq)
            self._db.execute("UPDATE jobs SET id = ? WHERE seq = ?", (job_id, seq))
            self._event(job_id, now, "transition", None, JobState.PENDING, reason, {})
        return self.get(job_id)

    def job_for_key(self, key: str, digest: str) -> JobRecord | None:
        """The job a submit with this Idempotency-Key made, or None; JobConflict when the key was used
        with another body."""
        with self._locked():
            row = self._db.execute("SELECT digest, job_id FROM idempotency WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if row["digest"] != digest:
            raise JobConflict(
                f"Idempotency-Key {key!r} was used for job {row['job_id']} with another body; use a new key"
            )
        return self.get(row["job_id"])

    def remember_key(self, key: str, digest: str, job_id: str) -> None:
        with self.transaction():
            self._db.execute("INSERT INTO idempotency VALUES (?, ?, ?)", (key, digest, job_id))

    def gpu_health(self) -> list[tuple[int, str, bool, str, str, float]]:
        """Stored GPU health marks: (gpu, uuid, healthy, reason, kind, since)."""
        with self._locked():
            rows = self._db.execute("SELECT * FROM gpu_health ORDER BY gpu").fetchall()
        return [(r["gpu"], r["uuid"], bool(r["healthy"]), r["reason"], r["kind"], r["since"]) for r in rows]

    def put_gpu_health(
        self, gpu: int, uuid: str, healthy: bool, reason: str, kind: str, since: float
    ) -> None:
        with self.transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO gpu_health VALUES (?, ?, ?, ?, ?, ?)",
                (gpu, uuid, int(healthy), reason, kind, since),
            )

    def get(self, job_id: str) -> JobRecord:
        with self._locked():
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}; `gpuslice ps` lists the jobs")
        return _record(row)

    def jobs(
        self,
        states: Sequence[JobState] | None = None,
        *,
        tenant: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[JobRecord]:
        sql, args = "SELECT * FROM jobs", []
        where = []
        if states is not None:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args += [s.value for s in states]
        if tenant is not None:
            where.append("tenant = ?")
            args.append(tenant)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq DESC" if newest_first else " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        with self._locked():
            rows = self._db.execute(sql, args).fetchall()
        found = []
        for row in rows:
            try:
                found.append(_record(row))
            except JobDamaged as err:  # left out of every listing and pass; GET of its id says why
                if row["seq"] not in self._damaged:
                    self._damaged.add(row["seq"])
                    _log.warning("%s", err)
        return found

    def highest_id(self) -> int:
        """The highest job number ever given (deleted rows included): the next one is above it."""
        with self._locked():
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        return int(row[0]) if row else 0

    def skip_ids_to(self, highest: int) -> None:
        """Give new jobs numbers above ``highest`` (job folders of a lost store must not be reused)."""
        with self.transaction():
            if self.highest_id() >= highest:
                return
            if self._db.execute("SELECT 1 FROM sqlite_sequence WHERE name = 'jobs'").fetchone():
                self._db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'jobs'", (highest,))
            else:
                self._db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?)", (highest,))

    def restore_job(self, job_id: str, spec: JobSpec, submitted_at: float, reason: str, now: float,
                    **fields: Any) -> JobRecord:  # fmt: skip
        """Put a job the store lost back under its own id (from its launch record), with ``fields``
        (state, gpus, attempts …); an existing row of that id is replaced. Recorded as an event."""
        state = JobState(fields.pop("state", JobState.RUNNING.value))
        with self.transaction():
            self._db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            self._db.execute(
                "INSERT INTO jobs (seq, id, spec, state, reason, user, tenant, priority, submitted_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (int(job_id) if job_id.isdigit() else None, job_id, json.dumps(spec_to_json(spec)),
                 state.value, reason, spec.user, spec.tenant, int(spec.priority), submitted_at),
            )  # fmt: skip
            self._set(job_id, fields)
            self._event(job_id, now, "recovery", None, state, reason, {})
        return self.get(job_id)

    def count(self, state: JobState) -> int:
        with self._locked():
            row = self._db.execute("SELECT COUNT(*) FROM jobs WHERE state = ?", (state.value,)).fetchone()
        return int(row[0])

    def counts(self) -> dict[JobState, int]:
        """Jobs per state (every state, 0 when none), in one query: the metrics read it at each scrape."""
        with self._locked():
            rows = self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        found = {JobState(r[0]): int(r[1]) for r in rows}
        return {s: found.get(s, 0) for s in JobState}

    def pending_groups(self) -> list[tuple[str, int, int, float]]:
        """(tenant, priority, pending jobs, when the longest-waiting entered the queue) per tenant and
        priority, without decoding any spec: entering the queue is the submit, or the end of the previous
        attempt for a requeued job."""
        sql = (
            "SELECT tenant, priority, COUNT(*), MIN(CASE WHEN attempts > 0 AND finished_at IS NOT NULL "
            "THEN finished_at ELSE submitted_at END) FROM jobs WHERE state = ? GROUP BY tenant, priority"
        )
        with self._locked():
            rows = self._db.execute(sql, (JobState.PENDING.value,)).fetchall()
        return [(str(r[0]), int(r[1]), int(r[2]), float(r[3])) for r in rows]

    def transition(
        self,
        job_id: str,
        new: JobState,
        reason: str,
        now: float,
        detail: dict[str, Any] | None = None,
        **fields: Any,
    ) -> JobRecord:
        """Move a job to ``new`` (validated), set ``fields``, and record the event, in one transaction."""
        with self.transaction():
            old = self.get(job_id).state
            check_transition(old, new)
            self._set(job_id, {"state": new.value, "reason": reason, **fields})
            self._event(job_id, now, "transition", old, new, reason, detail or {})
        return self.get(job_id)

    def update(self, job_id: str, **fields: Any) -> JobRecord:
        """Set non-state fields (pid, stop, suspended …) without an event."""
        with self.transaction():
            self.get(job_id)
            self._set(job_id, fields)
        return self.get(job_id)

    def _set(self, job_id: str, fields: dict[str, Any]) -> None:
        unknown = set(fields) - _MUTABLE - {"state"}
        if unknown:
            raise InternalError(f"store: {sorted(unknown)} cannot change after submit")
        values = [_column(k, v) for k, v in fields.items()]
        assignments = ", ".join(f"{k} = ?" for k in fields)
        self._db.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*values, job_id))

    # -- events -------------------------------------------------------------------------------------

    def event(
        self, job_id: str | None, kind: str, reason: str, now: float, detail: dict[str, Any] | None = None
    ) -> None:
        """Record a notable action that is not a state change (an enforcement warning, a signal sent)."""
        with self.transaction():
            self._event(job_id, now, kind, None, None, reason, detail or {})

    def _event(
        self,
        job_id: str | None,
        now: float,
        kind: str,
        old: JobState | None,
        new: JobState | None,
        reason: str,
        detail: dict[str, Any],
    ) -> None:
        self._db.execute(
            "INSERT INTO events (job_id, time, kind, old_state, new_state, reason, detail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job_id, now, kind, old and old.value, new and new.value, reason, json.dumps(detail)),
        )

    def events(
        self, job_id: str | None = None, *, after_id: int = 0, limit: int = 1000, kind: str | None = None
    ) -> list[tuple[int, JobEvent]]:
        """(event id, event) in order; ``after_id`` pages through them; ``kind`` keeps one kind."""
        sql, args = "SELECT * FROM events WHERE id > ?", [after_id]
        if job_id is not None:
            sql += " AND job_id = ?"
            args.append(job_id)
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        sql += " ORDER BY id LIMIT ?"
        args.append(limit)
        with self._locked():
            rows = self._db.execute(sql, args).fetchall()
        return [(int(r["id"]), JobEvent(
            job_id=r["job_id"] or "", time=r["time"], kind=r["kind"], reason=r["reason"],
            old_state=JobState(r["old_state"]) if r["old_state"] else None,
            new_state=JobState(r["new_state"]) if r["new_state"] else None, detail=json.loads(r["detail"]),
        )) for r in rows]  # fmt: skip

    # -- tenants ------------------------------------------------------------------------------------

    def tenants(self) -> dict[str, TenantRecord]:
        with self._locked():
            rows = self._db.execute("SELECT * FROM tenants ORDER BY name").fetchall()
        return {
            r["name"]: TenantRecord(
                name=r["name"],
                weight=r["weight"],
                max_gpus=r["max_gpus"],
                max_gpu_memory_bytes=r["max_gpu_memory_bytes"],
                response=json.loads(r["response"]),
            )
            for r in rows
        }

    def put_tenant(self, tenant: TenantRecord, now: float) -> None:
        with self.transaction():
            self._db.execute(
                "INSERT INTO tenants (name, weight, max_gpus, max_gpu_memory_bytes, response) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET weight = excluded.weight, "
                "max_gpus = excluded.max_gpus, max_gpu_memory_bytes = excluded.max_gpu_memory_bytes, "
                "response = excluded.response",
                (
                    tenant.name,
                    tenant.weight,
                    tenant.max_gpus,
                    tenant.max_gpu_memory_bytes,
                    json.dumps(tenant.response),
                ),
            )
            self._event(None, now, "tenant", None, None, f"tenant {tenant.name} set", {"name": tenant.name})


def _column(name: str, value: Any) -> Any:
    if name == "gpus":
        return json.dumps([int(g) for g in value])
    if name in _JSON_FIELDS:
        return json.dumps(value)
    if name == "suspended":
        return int(bool(value))
    return value


def _record(row: sqlite3.Row) -> JobRecord:
    """The row as a JobRecord; JobDamaged when it cannot be read (changed by hand, or damaged)."""
    try:
        return _decode(row)
    except (ValueError, TypeError, KeyError, AttributeError, UserError) as err:
        raise JobDamaged(
            f"job {row['id']}: its stored record cannot be read ({err}); it is left out of listings "
            "and scheduling. Its folder and logs are kept; remove the row or restore the state file"
        ) from None


def _decode(row: sqlite3.Row) -> JobRecord:
    return JobRecord(
        id=row["id"],
        seq=row["seq"],
        spec=spec_from_json(json.loads(row["spec"])),
        state=JobState(row["state"]),
        reason=row["reason"],
        user=row["user"],
        submitted_at=row["submitted_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        gpus=tuple(json.loads(row["gpus"])),
        mig=json.loads(row["mig"]) if row["mig"] else None,
        pid=row["pid"],
        pgid=row["pgid"],
        proc_start_time=row["proc_start_time"],
        exit_code=row["exit_code"],
        exit_signal=row["exit_signal"],
        attempts=row["attempts"],
        stop=row["stop"],
        stop_deadline=row["stop_deadline"],
        suspended=bool(row["suspended"]),
    )
