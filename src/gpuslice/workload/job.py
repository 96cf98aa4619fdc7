"""A job for ``gpuslice serve``: what to run, the slice it needs, and how the queue should treat it.

Lifecycle (every transition is recorded as an Event with a reason):

```text
PENDING ──start──► RUNNING ──exit 0──► SUCCEEDED
   ▲                  │ ├──exit ≠ 0 / lost / limit──► FAILED ──restart policy──► PENDING
   │                  │ └──preempted (SIGTERM, grace, SIGKILL)──► PREEMPTED ──► PENDING
   └──────────────────┴── cancel (from PENDING or RUNNING) ──► CANCELLED
```
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.node import MAX_GPUS_PER_NODE
from gpuslice.workload.request import MILLI_PER_GPU, Request, share_milli

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_TENANT",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "JobEvent",
    "JobSpec",
    "JobState",
    "Priority",
    "RestartPolicy",
    "TopologyNeed",
    "check_transition",
    "is_a_share",
]


class Priority(enum.IntEnum):
    """Strict priority levels, highest first in the queue. Names are what users type."""

    IDLE = 0
    LOW = 1
    NORMAL = 2
    HIGH = 3
    REALTIME = 4

    @classmethod
    def parse(cls, text: str) -> Priority:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            known = ", ".join(p.name.lower() for p in sorted(cls, reverse=True))
            raise InvalidRequest(f"unknown priority {text!r}; known: {known}") from None


class RestartPolicy(enum.Enum):
    NEVER = "never"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"


class TopologyNeed(enum.Enum):
    """How the GPUs of a multi-GPU job must be connected (see ``hardware/topology.py``)."""

    ANY = "any"
    NVLINK = "nvlink"  # every pair joined by NVLink (direct or through NVSwitch)
    PCIE_SWITCH = "pcie-switch"  # every pair behind one PCIe switch (PIX) or better


class JobState(enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"


TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    # RUNNING -> PENDING: its process never started (the launch lacked a file descriptor or disk space,
    # or the server stopped between storing RUNNING and launching); it did not run, so it is no attempt
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.PENDING}
    ),
    JobState.FAILED: frozenset({JobState.PENDING}),  # requeued by its restart policy
    JobState.PREEMPTED: frozenset({JobState.PENDING}),
    JobState.SUCCEEDED: frozenset({JobState.PENDING}),  # restart policy "always"
    JobState.CANCELLED: frozenset(),
}
TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
# A job asked to stop (cancel, max runtime, preemption) gets SIGTERM, then SIGKILL this many seconds
# later: the default of `serve --grace`, the node scheduler and the job supervisor. Kubernetes gives a
# pod the same 30 s by default (PodSpec terminationGracePeriodSeconds).
DEFAULT_GRACE_SECONDS = 30.0
# The tenant (team) a job counts against when it names none; listed by the server even when unused.
DEFAULT_TENANT = "default"
MAX_TENANT_WEIGHT = 1e6  # a tenant's fair-share weight; past a million, the others' shares round to nothing


def check_transition(old: JobState, new: JobState) -> None:
    """Raise InvalidRequest if a job may not go from ``old`` to ``new``."""
    if new not in TRANSITIONS[old]:
        raise InvalidRequest(f"a {old.value} job cannot become {new.value}")


def is_a_share(exclusive: bool, mig_profile: str, gpu_memory_bytes: int, compute_percent: int) -> bool:
    """The one rule for "a share of one GPU rather than whole GPUs", for a serve job and a pod's container
    alike: not exclusive, no MIG instance, and some memory or a compute percent below 100 asked for."""
    return not exclusive and not mig_profile and (gpu_memory_bytes > 0 or 0 < compute_percent < 100)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What the user asked for. Validated on creation; ``request()`` is its slice for the ledger.

    A slice is either whole GPUs (``gpus`` = k, exclusive), a share of one GPU (``gpu_memory_bytes``
    and/or ``compute_percent`` < 100), or a MIG profile ("3g.40gb"). Memory is per GPU, in bytes.
    ``compute_percent`` 0 means "not given": whole GPUs without memory, no compute guarantee with it.
    """

    command: tuple[str, ...]
    gpus: int = 1
    gpu_memory_bytes: int = 0  # per GPU; 0 with compute 100 = whole GPUs
    compute_percent: int = 0  # 1..100 of each GPU's SMs; 0 = not given
    mig_profile: str = ""
    gpu_models: tuple[str, ...] = ()
    excluded_gpu_models: tuple[str, ...] = ()
    exclusive: bool = False
    topology: TopologyNeed = TopologyNeed.ANY
    priority: Priority = Priority.NORMAL
    tenant: str = DEFAULT_TENANT
    preemptible: bool = True
    max_runtime_seconds: float | None = None
    restart: RestartPolicy = RestartPolicy.NEVER
    max_restarts: int = 3
    user: str = ""
    cwd: str = ""
    env: tuple[tuple[str, str], ...] = ()
    # Host limits, enforced by the kernel through the job's cgroup (0: none): RAM in bytes (the OOM killer
    # acts inside the job beyond it) and CPUs of time per period (1.5 = one and a half cores).
    host_memory_bytes: int = 0
    cpus: float = 0.0

    def __post_init__(self) -> None:
        if not self.command:
            raise InvalidRequest("command: a job needs a command to run")
        if not 0 <= self.gpus <= MAX_GPUS_PER_NODE:
            raise InvalidRequest(f"gpus: {self.gpus} is not 0..{MAX_GPUS_PER_NODE}")
        if not 0 <= self.compute_percent <= 100:
            raise InvalidRequest(f"compute_percent: {self.compute_percent} is not 1..100")
        if self.gpu_memory_bytes < 0:
            raise InvalidRequest("gpu_memory_bytes: cannot be negative")
        if self.gpus == 0 and (self.gpu_memory_bytes or self.mig_profile or self.exclusive):
            raise InvalidRequest("gpus: GPU memory, a MIG profile or exclusive use needs gpus >= 1")
        if self.mig_profile and (self.gpus != 1 or self.gpu_memory_bytes or self.compute_percent):
            raise InvalidRequest("mig_profile: a MIG job takes one instance; drop --gpus/--mem/--cores")
        if self.gpus > 1 and self.is_share:
            raise InvalidRequest(
                "gpus: a share of a GPU (memory or compute < 100 %) is for one GPU; ask for whole GPUs"
            )
        if self.topology is not TopologyNeed.ANY and self.gpus < 2:
            raise InvalidRequest("topology: a topology need only makes sense for 2 or more GPUs")
        if self.max_runtime_seconds is not None and self.max_runtime_seconds <= 0:
            raise InvalidRequest("max_runtime_seconds: must be positive")
        if self.max_restarts < 0:
            raise InvalidRequest("max_restarts: cannot be negative")
        if not self.tenant:
            raise InvalidRequest("tenant: cannot be empty")
        if self.host_memory_bytes < 0:
            raise InvalidRequest("host_memory_bytes: cannot be negative")
        if not 0 <= self.cpus <= 4096 or self.cpus != self.cpus:
            raise InvalidRequest(f"cpus: {self.cpus} is not 0..4096 (0: no limit)")
        if 0 < self.cpus < 0.01:
            raise InvalidRequest(f"cpus: {self.cpus} is below the kernel's least quota (0.01 CPU)")
        self.request()  # model include/exclude conflicts surface here, at submit time

    @property
    def is_share(self) -> bool:
        """A share of one GPU rather than whole GPUs (``is_a_share``)."""
        return is_a_share(self.exclusive, self.mig_profile, self.gpu_memory_bytes, self.compute_percent)

    def request(self) -> Request:
        """The ledger request: whole GPUs take 1000 milli (all of each GPU); a share takes its compute
        percent as milli-GPU and its memory. A memory-only share reserves 1 milli: no compute
        guarantee, but the GPU is marked shared so no whole-GPU job lands on it."""
        if self.gpus == 0:
            return Request(cpu_milli=0)
        milli = share_milli(self.compute_percent, True) if self.is_share else MILLI_PER_GPU
        return Request(
            cpu_milli=0,
            num_gpu=self.gpus,
            gpu_milli=milli,
            gpu_models=self.gpu_models,
            gpu_memory_bytes=self.gpu_memory_bytes if self.is_share else 0,
            excluded_gpu_models=self.excluded_gpu_models,
        )


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One recorded transition (or notable action, e.g. an enforcement warning) of a job."""

    job_id: str
    time: float
    kind: str  # "transition", "enforcement", "placement", …
    old_state: JobState | None
    new_state: JobState | None
    reason: str
    detail: dict[str, object] = field(default_factory=dict)
