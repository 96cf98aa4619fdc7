"""What SQLite's errors mean for the server, and the state file's condition as the server last saw it.

```text
SQLite says                                      the server raises   HTTP   health
database is locked / busy (another process       StoreBusy           503    degraded: "locked by another
  holds the write lock past the busy timeout)                               process" until a write works
disk I/O error, disk image is malformed, not a   StoreFailing        503    degraded: the error, until a
  database, readonly database, unable to open                               write works again
database or disk is full                         StoreFull           503    (unchanged: the next write
                                                                            may work once space is freed)
anything else (a constraint, a misuse)           itself              500    a bug
```

Nothing was changed when one of these is raised (the transaction rolled back), so the client may
retry; Retry-After says when. The condition lives in memory: ``/v1/health`` reads it without touching
SQLite, and the daemon probes with one small write while it is not "ok" (``Store.probe``).

A failing disk can fail every call many times a second; each kind is logged once a minute with how many
calls failed meanwhile (``RateLimitedLog``), never a traceback per call.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuslice.server.errors import StoreBusy, StoreDamaged, StoreFailing, StoreFull

__all__ = [
    "LOG_INTERVAL_SECONDS", "RateLimitedLog", "StoreCondition", "classify", "opening_error", "queue_busy",
]  # fmt: skip

_log = logging.getLogger("gpuslice.server")
LOG_INTERVAL_SECONDS = 60.0

# SQLite's primary result codes (the low byte of an extended code): sqlite.org/rescode.html
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_FAILING_CODES = frozenset({
    sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL,
})  # fmt: skip
# An error raised by hand (a test) or by an older SQLite carries no code: its text tells.
_BUSY_WORDS = ("database is locked", "database table is locked", "database is busy")
_FAILING_WORDS = ("disk i/o error", "malformed", "not a database", "readonly database", "unable to open")


def classify(err: sqlite3.DatabaseError, path: Path) -> Exception:
    """The server's error for SQLite's ``err`` about the state file at ``path``: StoreBusy, StoreFailing,
    StoreFull, or ``err`` itself when it is not about the file (a constraint, a misuse: a bug)."""
    code = getattr(err, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(err).lower()
    if primary == sqlite3.SQLITE_FULL or (primary is None and "full" in text):
        return StoreFull(f"the disk holding {path} is full ({os.strerror(errno.ENOSPC)}): nothing was "
                         "changed; free some space and retry")  # fmt: skip
    if primary in _BUSY_CODES or (primary is None and any(w in text for w in _BUSY_WORDS)):
        return StoreBusy(
            f"the state file {path} is locked by another process (an sqlite3 shell, a backup?): nothing "
            "was changed; retry, or end that process"
        )
    if primary in _FAILING_CODES or (primary is None and any(w in text for w in _FAILING_WORDS)):
        return StoreFailing(
            f"the state file {path} cannot be used ({err}): nothing was changed; check the disk "
            "(dmesg): the server goes on by itself once a write works again"
        )
    if type(err) is sqlite3.DatabaseError:  # no finer class: SQLite met something it cannot read
        return StoreFailing(f"the state file {path} cannot be read ({err}); check the disk (dmesg)")
    return err


def opening_error(err: sqlite3.DatabaseError | StoreFailing, path: Path) -> Exception:
    """What to say when the state file cannot be opened: a full disk or a lock as such (the file is
    fine), anything else as a damaged file with the way out."""
    found = classify(err, path) if isinstance(err, sqlite3.DatabaseError) else err
    if isinstance(found, StoreFull | StoreBusy):
        return found
    return StoreDamaged(
        f"state file {path} is damaged ({err}); stop the server, move it aside "
        f"(mv {path} {path}.damaged) and start again: running jobs are re-adopted from "
        "their records, their logs are kept, the history of ended jobs stays in the moved file"
    )


def queue_busy(seconds: float) -> StoreBusy:
    """This server's own calls held the store for ``seconds``: busy, though not the file's fault."""
    return StoreBusy(f"the state file has been busy with other calls for {seconds:g} s: nothing was "
                     "changed; retry")  # fmt: skip


class RateLimitedLog:
    """One warning per key per ``interval`` seconds; the next one says how many were held back."""

    def __init__(self, interval: float = LOG_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warning(self, key: str, message: str) -> bool:
        """Log ``message`` unless ``key`` was logged less than ``interval`` ago; returns whether it was."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            held = self._held.pop(key, 0)
            self._last[key] = now
        more = f" ({held} more like it in the last {self.interval:g} s)" if held else ""
        _log.warning("%s%s", message, more)
        return True

    def forget(self, key: str) -> None:
        """The trouble ended: the next one is logged at once."""
        with self._lock:
            self._last.pop(key, None)
            self._held.pop(key, None)


@dataclass(frozen=True, slots=True)
class _State:
    kind: str  # "ok" | "busy" | "failing"
    reason: str
    since: float


class StoreCondition:
    """The state file's condition: "ok", "busy" (locked by another process) or "failing" (the disk),
    with the reason and since when. Set by the store at each failure and at each write that works; read
    from memory (one attribute), so a health check never waits on SQLite."""

    def __init__(self, clock: Callable[[], float] = time.time, log: RateLimitedLog | None = None) -> None:
        self._state = _State("ok", "", clock())
        self.clock = clock
        self.log = log or RateLimitedLog()

    @property
    def kind(self) -> str:
        return self._state.kind

    @property
    def reason(self) -> str:
        return self._state.reason

    @property
    def ok(self) -> bool:
        return self._state.kind == "ok"

    def failed(self, error: Exception) -> None:
        """Record a StoreBusy or StoreFailing (others are not about the file's condition)."""
        kinds = {StoreBusy: "busy", StoreFailing: "failing"}
        kind = kinds.get(type(error))
        if kind is None:
            return
        if self._state.kind != kind or self._state.reason != str(error):
            self._state = _State(kind, str(error), self.clock())
        self.log.warning(f"store-{kind}", f"store {kind}: {error}")

    def worked(self) -> None:
        """A write committed: the file is usable again."""
        if self._state.kind != "ok":
            _log.warning("state file usable again after %s (%s)", self._state.kind, self._state.reason)
            self.log.forget(f"store-{self._state.kind}")
            self._state = _State("ok", "", self.clock())
