"""Every error a user can cause, in one tree; mapped to exit and HTTP codes in one place.

```text
GpusliceError
├─ UserError          CLI exit 2 · HTTP 4xx   the input is wrong; the message says how to fix it
│  ├─ InvalidSize          a size string such as "8GB?" cannot be parsed
│  ├─ InvalidRequest       a request asks for something impossible (0 GPUs at 500 milli, 9 GPUs per node …)
│  ├─ UnknownPolicy        a policy name is not in the registry
│  ├─ UnknownGpuModel      a GPU model name is not in the catalogue
│  ├─ UnknownTrace         a trace name has no CSV file
│  └─ TraceFormatError     a trace CSV has a malformed row (names the file and the row)
└─ InternalError      CLI exit 1 · HTTP 500   a bug: the message says so
   └─ LedgerError          a release of a placement the ledger does not hold (never a refused reserve)
```
"""

from __future__ import annotations

__all__ = [
    "GpusliceError",
    "InternalError",
    "InvalidRequest",
    "InvalidSize",
    "LedgerError",
    "TraceFormatError",
    "UnknownGpuModel",
    "UnknownPolicy",
    "UnknownTrace",
    "UserError",
    "exit_code",
]


class GpusliceError(Exception):
    """Base of every error gpuslice raises on purpose."""


class UserError(GpusliceError):
    """The input is wrong; the message names it and says how to fix it."""


class InvalidSize(UserError):
    """A size string cannot be parsed."""


class InvalidRequest(UserError):
    """A request's fields contradict each other or exceed what any GPU can give."""


class UnknownPolicy(UserError):
    """A policy name is not in its family's registry."""


class UnknownGpuModel(UserError):
    """A GPU model name is not in the catalogue."""


class UnknownTrace(UserError):
    """A trace name has no pod-list CSV where it was looked for."""


class TraceFormatError(UserError):
    """A trace CSV row is malformed; the message names the file and the row."""


class InternalError(GpusliceError):
    """A broken invariant: a bug in gpuslice, never the user's fault."""


class LedgerError(InternalError):
    """A release of a placement the ledger does not hold (released twice, or never reserved)."""


def exit_code(error: BaseException) -> int:
    """CLI exit status for an error: 2 for user errors, 1 for everything else."""
    return 2 if isinstance(error, UserError) else 1
