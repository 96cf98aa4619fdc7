"""The server's own user errors, each under its family in ``gpuslice.errors``, and their HTTP status.

```text
JobNotFound, GpuNotFound, PolicyNotFound   NotFound          404  no job, GPU, policy family or map key
TenantNotFound                             NotFound          404  no tenant set or used of that name
JobConflict                                Conflict          409  the job's state does not allow the action
JobDamaged                                 Conflict          409  the job's stored row cannot be read
JobLogRefused                              Conflict          409  the job's log is a link or not its file
NotAuthenticated (gpuslice.errors)                           401  no bearer token, or the wrong one
ForbiddenUser                              Forbidden         403  a request claims another user
TooManyFollowers                           TooManyRequests   429  the cap on clients following logs is reached
ServerUnavailable                          Unavailable       (client) the server does not answer at its URL
OutcomeUnknown                             Unavailable       (client, exit 4) a change sent, its answer lost
StoreFull                                  Unavailable       503  the disk is full; nothing changed
StoreBusy                                  StoreUnavailable  503  another process holds the state file's lock
StoreFailing                               StoreUnavailable  503  the state file's disk fails (EIO, damage)
StoreDamaged                               Unavailable       (serve) the state file is not a database
PortTaken                                  Unavailable       (serve, exit 3) another process listens there
```

Every other user error keeps its family's status (``gpuslice.errors``): InvalidRequest 400 (its
QuotaNeverFits, scheduler.quota, 422), NoSuchMap and NoPolicyLoaded (programs.slot) 404, PolicyRejected
(programs.loader) 422.
"""

from __future__ import annotations

from gpuslice.errors import (
    Conflict,
    Forbidden,
    NotAuthenticated,
    NotFound,
    TooManyRequests,
    Unavailable,
    UserError,
)

__all__ = [
    "ForbiddenUser",
    "GpuNotFound",
    "JobConflict",
    "JobDamaged",
    "JobLogRefused",
    "JobNotFound",
    "NotAuthenticated",
    "OutcomeUnknown",
    "PolicyNotFound",
    "PortTaken",
    "ServerUnavailable",
    "StoreBusy",
    "StoreDamaged",
    "StoreFailing",
    "StoreFull",
    "StoreUnavailable",
    "TenantNotFound",
    "TooManyFollowers",
    "http_status",
]


class JobNotFound(NotFound):
    """No job has the id that was asked for."""


class GpuNotFound(NotFound):
    """No GPU has the index that was asked for."""


class TenantNotFound(NotFound):
    """No tenant of that name is set, nor has jobs (nor is the default tenant)."""


class JobConflict(Conflict):
    """The job is in a state where the action makes no sense (e.g. cancelling a finished job)."""


class JobDamaged(Conflict):
    """The job's stored record cannot be read (a row changed by hand or damaged); the message says so."""


class JobLogRefused(Conflict):
    """The job's log file is not what gpuslice made there (a link, a FIFO, a hard link): it is not read."""


class ForbiddenUser(Forbidden):
    """A request claims a user other than the one running the server."""


class TooManyFollowers(TooManyRequests):
    """So many clients follow logs already that one more is refused; the client may retry later."""


class PolicyNotFound(NotFound):
    """A policy family the server does not run, or a map or map key the loaded policy does not have."""


class ServerUnavailable(Unavailable):
    """The client cannot reach ``gpuslice serve`` at its URL."""


class OutcomeUnknown(Unavailable):
    """A request that changes the server's state reached it, but no answer came back (none within the
    client's wait, or the connection broke first): the server may still apply it. The message says so and
    names the command that shows what happened; exit 4, where "no server at all" is 2."""

    exit_status = 4


class StoreFull(Unavailable):
    """The disk holding the state file is full: the change was not made; retrying later works (503,
    with Retry-After: the server itself lacks room, the request was fine)."""

    http_status = 503
    retry_after_seconds = 5


class StoreUnavailable(Unavailable):
    """The state file cannot be used for now: nothing was changed (503, with Retry-After). The daemon
    skips its passes until a probe write works again (server/store_faults.py)."""

    http_status = 503
    retry_after_seconds = 2


class StoreBusy(StoreUnavailable):
    """Another process held the state file's write lock past the busy timeout; retry shortly."""


class StoreFailing(StoreUnavailable):
    """The disk under the state file fails (an I/O error, a damaged page); /v1/health says degraded."""

    retry_after_seconds = 30


class StoreDamaged(Unavailable):
    """The state file cannot be read as the server's database; the message says what to do with it."""


class PortTaken(Unavailable):
    """Another process (another server) listens on the port ``serve`` was given; exit 3, nothing written."""

    exit_status = 3


def http_status(error: UserError) -> int:
    """The HTTP status of a user error: its own ``http_status`` (a FieldError's 400 or 422), else its
    family's (``gpuslice.errors``)."""
    return int(error.http_status)
