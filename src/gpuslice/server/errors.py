"""The server's user errors, under ``gpuslice.errors.UserError``, each with the HTTP status it maps to.

```text
UserError (gpuslice.errors)
├─ InvalidRequest (gpuslice.errors)   400  the request contradicts itself or this machine
├─ JobNotFound                        404  no job with that id
├─ GpuNotFound                        404  no GPU with that index
├─ JobConflict                        409  the job's state does not allow the action (cancel a finished job)
├─ NotAuthenticated                   401  no bearer token, or the wrong one
├─ ForbiddenUser                      403  a request claims another user; the server never switches users
└─ ServerUnavailable                  (client) the server does not answer at its URL; says how to start it
```
They live here rather than in ``gpuslice/errors.py`` only because the server was built alongside the
core; they belong in that tree and can move there unchanged.
"""

from __future__ import annotations

from gpuslice.errors import InvalidRequest, UserError

__all__ = [
    "ForbiddenUser",
    "GpuNotFound",
    "JobConflict",
    "JobNotFound",
    "NotAuthenticated",
    "ServerUnavailable",
    "http_status",
]


class JobNotFound(UserError):
    """No job has the id that was asked for."""


class GpuNotFound(UserError):
    """No GPU has the index that was asked for."""


class JobConflict(UserError):
    """The job is in a state where the action makes no sense (e.g. cancelling a finished job)."""


class NotAuthenticated(UserError):
    """A state-changing call came without the bearer token, or with a wrong one."""


class ForbiddenUser(UserError):
    """A request claims a user other than the one running the server."""


class ServerUnavailable(UserError):
    """The client cannot reach ``gpuslice serve`` at its URL."""


def http_status(error: UserError) -> int:
    """The HTTP status for a user error: the one place where the tree meets HTTP."""
    for cls, status in (
        (JobNotFound, 404),
        (GpuNotFound, 404),
        (JobConflict, 409),
        (NotAuthenticated, 401),
        (ForbiddenUser, 403),
        (InvalidRequest, 400),
    ):
        if isinstance(error, cls):
            return status
    return 400
