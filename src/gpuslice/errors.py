"""Every error gpuslice raises on purpose, in one tree; mapped to exit and HTTP codes here.

```text
GpusliceError
├─ UserError                CLI exit 2 · HTTP 400   the input is wrong; the message says how to fix it
│  ├─ InvalidSize                a size string such as "8GB?" cannot be parsed
│  ├─ InvalidRequest             a request asks for something impossible (0 GPUs at 500 milli, 9 GPUs …)
│  │  └─ QuotaNeverFits (scheduler.quota)   HTTP 422   a job needs more than its tenant's whole quota
│  ├─ UnknownName                a name that is not in its catalogue; the message lists the known ones
│  │  ├─ UnknownPolicy                a policy name
│  │  │  └─ UnknownMemoryPolicy (memory.policies)
│  │  ├─ UnknownGpuModel              a GPU model name
│  │  ├─ UnknownTrace                 a trace name with no CSV file
│  │  ├─ UnknownMigGpu, UnknownMigProfile (hardware.mig)
│  │  ├─ UnknownSystem (hardware.topology_profiles)
│  │  ├─ UnknownModel (estimate.errors)
│  │  └─ UnknownWorkload (memory.workloads)
│  ├─ TraceFormatError           a trace CSV has a malformed row (names the file and the row)
│  ├─ InvalidInput (inputs)        a number out of range, a file that is not text, an unwritable folder
│  ├─ NotFound                   HTTP 404   no such job, GPU, policy or map
│  │  ├─ JobNotFound, GpuNotFound, PolicyNotFound, TenantNotFound (server.errors)
│  │  └─ NoSuchMap, NoPolicyLoaded (programs.slot)
│  ├─ Conflict                   HTTP 409   the state does not allow the action
│  │  └─ JobConflict, JobDamaged, JobLogRefused (server.errors)
│  ├─ NotAuthenticated           HTTP 401   no bearer token, or the wrong one
│  ├─ Forbidden                  HTTP 403   the caller may not do this
│  │  └─ ForbiddenUser (server.errors)
│  ├─ TooManyRequests            HTTP 429   a cap is reached; retry later
│  │  └─ TooManyFollowers (server.errors)
│  ├─ Unavailable                something this machine lacks or that does not answer
│  │  ├─ NvmlUnavailable              nvidia-ml-py is not installed, or NVML finds no NVIDIA driver
│  │  ├─ NoGpuDriver (node.discovery)
│  │  ├─ MpsUnavailable (node.enforcement)
│  │  ├─ MigNotEnabled (hardware.mig_nvml)
│  │  ├─ ShimUnavailable (shim)
│  │  ├─ NodeLockError (k8s.node_lock)
│  │  ├─ ServerUnavailable, StoreFull, StoreDamaged (server.errors)   StoreFull: HTTP 503
│  │  ├─ OutcomeUnknown (server.errors)   CLI exit 4: a change was sent, its answer never came
│  │  ├─ PortTaken (server.errors)   CLI exit 3
│  │  └─ StoreUnavailable (server.errors)   HTTP 503
│  │     └─ StoreBusy, StoreFailing (server.errors)
│  ├─ PolicyRejected (programs.loader)   HTTP 422
│  ├─ PolicyFamilyMismatch (programs.loader)
│  ├─ PolicyInitError (programs.loader)
│  │  └─ PolicyStartError (programs.policy_process)   a policy file's worker process could not build it
│  ├─ BuiltinNotExportable (programs.export)
│  ├─ MapError (programs.maps)
│  │  └─ MapFull (programs.maps)
│  ├─ FieldError (server.models)   HTTP 400 or 422
│  ├─ ServerError (server.client)
│  ├─ TopologyError (hardware.topology)
│  │  └─ TopologyParseError (hardware.topology_smi)
│  ├─ InvalidMigLayout, MigRequestTooLarge (hardware.mig)
│  ├─ MigInstanceMissing (node.discovery)
│  ├─ MigCommandFailed (node.mig_manager)
│  │  └─ MigPermissionDenied (node.mig_manager)
│  ├─ RegistrationFailed (k8s.device_plugin.plugin)
│  ├─ AllocationRefused (k8s.device_plugin.allocation)
│  ├─ PrepareRefused (k8s.dra.prepare)
│  ├─ TemplateUnavailable (k8s.webhook)
│  ├─ InventoryUnavailable (k8s.mig_inventory)
│  ├─ GpuSetUnavailable (policies.gpuset.base)
│  ├─ MalformedModelConfig, InvalidEstimateOptions (estimate.errors)
│  └─ CostProfileError (memory.cost)
├─ ApiError (k8s.kube_client)   a Kubernetes API call failed; the message is the API server's words
│  └─ AlreadyBound (k8s.extender.kube)   a Binding for a pod that is bound already (its 409)
└─ InternalError            CLI exit 1 · HTTP 500   a bug: the message says so; the server logs it
   └─ LedgerError                a release of a placement the ledger does not hold, or a broken invariant
```

The tree is exact: ``tests/test_error_tree.py`` reads it and checks both ways (every class drawn exists
in the module named, under the parent drawn; every error class of the package is drawn). A name without
a module lives here.

A family's HTTP status is its ``http_status``; ``server.errors.http_status`` reads it. Exceptions that
never reach a user stay outside the tree: a hook's timeout (``programs.hook_runner.HookTimeout``, a
BaseException so that policy code cannot catch it), the shim's ``RegionError`` (a file that is not a
job region; the monitor skips it), fake_load's simulated ``OutOfMemory`` (caught where it is raised),
``shim.build.BuildError``, which setup.py loads by path at install time, before this package can
be imported, the node lock's ``k8s.node_lock.NodeLockConflict`` (a 409 on the Node, always caught
there and read again), ``node.private_files.UnsafeFile`` (standard library only, for the supervisor
that loads it by path; its callers word it: JobLogRefused, MpsUnavailable, a failed launch), and
``node.proctree.ContainmentUnavailable`` (standard library only, for the same supervisor; serve words it as
an InvalidRequest naming ``--containment``, the supervisor as the job's exit 126 with the reason).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "Conflict",
    "Forbidden",
    "GpusliceError",
    "InternalError",
    "InvalidRequest",
    "InvalidSize",
    "LedgerError",
    "NotAuthenticated",
    "NotFound",
    "NvmlUnavailable",
    "TooManyRequests",
    "TraceFormatError",
    "Unavailable",
    "UnknownGpuModel",
    "UnknownName",
    "UnknownPolicy",
    "UnknownTrace",
    "UserError",
    "exit_code",
]


class GpusliceError(Exception):
    """Base of every error gpuslice raises on purpose."""


class UserError(GpusliceError):
    """The input is wrong; the message names it and says how to fix it."""

    http_status: ClassVar[int] = 400


class InvalidSize(UserError):
    """A size string cannot be parsed."""


class InvalidRequest(UserError):
    """A request's fields contradict each other or exceed what any GPU can give."""


class UnknownName(UserError):
    """A name is not in its catalogue (policies, GPU models, traces, MIG profiles …)."""


class UnknownPolicy(UnknownName):
    """A policy name is not in its family's registry."""


class UnknownGpuModel(UnknownName):
    """A GPU model name is not in the catalogue."""


class UnknownTrace(UnknownName):
    """A trace name has no pod-list CSV where it was looked for."""


class TraceFormatError(UserError):
    """A trace CSV row is malformed; the message names the file and the row."""


class NotFound(UserError):
    """No object (job, GPU, policy, map entry) has the id or name that was asked for."""

    http_status: ClassVar[int] = 404


class Conflict(UserError):
    """The object's state does not allow the action (e.g. cancelling a finished job)."""

    http_status: ClassVar[int] = 409


class NotAuthenticated(UserError):
    """A call that needs the bearer token came without it, or with a wrong one."""

    http_status: ClassVar[int] = 401


class Forbidden(UserError):
    """The caller is known but may not do this."""

    http_status: ClassVar[int] = 403


class TooManyRequests(UserError):
    """A cap on concurrent use is reached; the same call may succeed later."""

    http_status: ClassVar[int] = 429


class Unavailable(UserError):
    """Something gpuslice needs is missing on this machine or does not answer (a driver, NVML, MPS,
    the shim, the server); the message says how to provide it."""


class NvmlUnavailable(Unavailable):
    """NVML cannot be used here: nvidia-ml-py is not installed, or there is no NVIDIA driver (MIG
    state, topology and telemetry all read it)."""


class InternalError(GpusliceError):
    """A broken invariant: a bug in gpuslice, never the user's fault."""

    http_status: ClassVar[int] = 500


class LedgerError(InternalError):
    """A release of a placement the ledger does not hold (released twice, or never reserved)."""


def exit_code(error: BaseException) -> int:
    """CLI exit status for an error: its class's ``exit_status`` if it has one (PortTaken: 3, as uvicorn
    exits when it cannot bind; OutcomeUnknown: 4, a change sent whose answer never came), else 2 for
    user errors, 1 for everything else."""
    own = getattr(error, "exit_status", None)
    return own if isinstance(own, int) else 2 if isinstance(error, UserError) else 1
