"""The server's user errors, under ``gpuslice.errors.UserError``, each with the HTTP status it maps to.

```text
UserError (gpuslice.errors)
├─ InvalidRequest (gpuslice.errors)   400  the request contradicts itself or this machine
├─ JobNotFound                        404  no job with that id
├─ GpuNotFound                        404  no GPU with that index
├─ JobConflict                        409  the job's state does not allow the action (cancel a finished job)
├─ NotAuthenticated                   401  no bearer token, or the wrong one
├─ ForbiddenUser                      403  a request claims another user; the server never switches users
├─ TooManyFollowers                   429  the cap on clients following logs is reached
├─ PolicyNotFound                     404  no such policy family or map key on this server
├─ NoSuchMap, NoPolicyLoaded (programs.slot)  404  no such map; only the built-in runs (nothing to unload)
├─ PolicyRejected (programs.loader)   422  the verifier rejected a policy file; the detail lists why
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
    "PolicyNotFound",
    "ServerUnavailable",
    "TooManyFollowers",
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


class TooManyFollowers(UserError):
    """So many clients follow logs already that one more is refused; the client may retry later."""


class PolicyNotFound(UserError):
    """A policy family the server does not run, or a map or map key the loaded policy does not have."""


class ServerUnavailable(UserError):
    """The client cannot reach ``gpuslice serve`` at its URL."""


def http_status(error: UserError) -> int:
    """The HTTP status for a user error: the one place where the tree meets HTTP."""
    # Imported here: the client imports this module, and should not pay for the verifier's imports.
    from gpuslice.programs.loader import PolicyRejected
    from gpuslice.programs.slot import NoPolicyLoaded, NoSuchMap

    own = getattr(error, "http_status", None)  # an error that says its own (FieldError for a limit: 422)
    if isinstance(own, int):
        return own
    for cls, status in (
        (JobNotFound, 404),
        (GpuNotFound, 404),
        (JobConflict, 409),
        (NotAuthenticated, 401),
        (ForbiddenUser, 403),
        (TooManyFollowers, 429),
        (PolicyNotFound, 404),
        (NoSuchMap, 404),
        (NoPolicyLoaded, 404),
        (PolicyRejected, 422),
        (InvalidRequest, 400),
    ):
        if isinstance(error, cls):
            return status
    return 400
