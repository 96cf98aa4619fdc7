"""What crosses every boundary: a Placement (where a request went) or a Refusal (why it could not).

``RefusalCode`` is the one vocabulary of "why not" in every home: the fit rule's checks (sim, serve, the
Kubernetes extender, the DRA allocator, the MIG planner) and the reasons only a queue knows (serve: a
quota, a queue head, preemption under way, an unhealthy GPU). A ``Refusal`` is one such code on one node
with its amounts, as kube-scheduler's ``Fits`` gives them: what the request needs of the resource the code
names, what is free, and the capacity, in ``unit``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuslice.units import format_size
from gpuslice.workload.request import Request

if TYPE_CHECKING:
    from gpuslice.ledger.mig import MigHold

__all__ = ["Placement", "Refusal", "RefusalCode", "Unit"]


@dataclass(frozen=True, slots=True)
class Placement:
    """``request`` placed on ``node`` (ledger index) using ``gpus`` (indices inside the node).

    ``id`` is given by ``Ledger.reserve``; a placement built by hand has id -1 until then. ``mig``: the
    MIG instance it holds (``Ledger.reserve_mig``), None for shares and whole GPUs.
    """

    node: int
    gpus: tuple[int, ...]
    request: Request
    id: int = -1
    mig: MigHold | None = None


class RefusalCode(enum.Enum):
    """Why one node cannot take one request. The value is the fixed text shown to people."""

    NO_SUCH_NODE = "no such node"
    INSUFFICIENT_CPU = "insufficient CPU"
    INSUFFICIENT_MEMORY = "insufficient memory"
    GPU_MODEL_NOT_ALLOWED = "GPU model not allowed"
    WRONG_GPU_COUNT = "wrong number of GPUs chosen"
    NO_SUCH_GPU = "no such GPU"
    DUPLICATE_GPU = "same GPU chosen twice"
    INSUFFICIENT_GPU = "insufficient free GPU"
    INSUFFICIENT_GPU_MEMORY = "insufficient free GPU memory"
    EXCLUDED_BY_POLICY = "excluded by the placement policy"
    # The GPUs the home lets this request use (healthy, not in MIG mode, under the share limit, the
    # job's eligible GPUs) are fewer than it asks for.
    NO_USABLE_GPU = "too few GPUs this request may use"
    # Checked by the home that knows the wiring or the MIG layouts, in this vocabulary.
    NO_GPU_SET = "no free GPU set meets the topology need"
    NO_MIG_SLOT = "no free MIG instance of this profile"
    # The node's room is held for a higher-priority pod that preempted others there (Kubernetes).
    RESERVED = "held for a higher-priority pod that preempted pods on this node"
    # A queue's own reasons (serve): the job would fit, or is judged on fewer GPUs, for these.
    NOT_TRIED = "not judged yet"  # submitted since the last scheduling pass: not a failure
    UNHEALTHY_GPU = "a GPU it needs is unhealthy"
    QUOTA = "over its tenant's quota"
    PREEMPTING = "waiting for preempted work to end"
    BEHIND_QUEUE_HEAD = "waiting behind the head of the queue"

    @property
    def label(self) -> str:
        """The code as a metric label (``gpuslice_scheduling_failures_total{reason=…}``): small and
        stable, so that rewording a message never changes a series or an alert."""
        return self.name.lower()

    @property
    def curable(self) -> bool:
        """Could evicting lower-priority work make this refusal go away? Not when the node itself, or
        the request against it, rules it out (Kubernetes: ``UnschedulableAndUnresolvable``, which sends
        no node of it to preemption); every other refusal is about what others hold. The one home of
        this rule: the extender's unresolvable nodes and its preemption candidates read it."""
        return self not in _UNCURABLE


_UNCURABLE = frozenset({
    RefusalCode.NO_SUCH_NODE, RefusalCode.GPU_MODEL_NOT_ALLOWED, RefusalCode.WRONG_GPU_COUNT,
    RefusalCode.NO_SUCH_GPU, RefusalCode.DUPLICATE_GPU, RefusalCode.UNHEALTHY_GPU,
})  # fmt: skip


class Unit(enum.Enum):
    """What a refusal's amounts count."""

    NONE = ""  # the code names no resource (a model, a MIG slot, a queue's reason)
    GPUS = "GPUs"
    GPU_MEMORY = "bytes of GPU memory"
    GPU_MILLI = "milli-GPU"
    CPU_MILLI = "milli-CPU"
    MEMORY = "bytes of memory"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why ``node`` (and ``gpu``, when one GPU decided) cannot take a request: the code and, for a code
    that names a resource, the amounts in ``unit``: ``need`` (per GPU for GPU memory and compute),
    ``free`` (the most the node could give it: the best GPU, or the GPUs that qualify) and ``capacity``
    (that GPU's or node's total). The ledger is unchanged when it returns one."""

    code: RefusalCode
    node: int
    gpu: int = -1
    need: float = 0
    free: float = 0
    capacity: float = 0
    unit: Unit = Unit.NONE

    @property
    def amounts(self) -> str:
        """``need 8 GiB, free 4 GiB of 16 GiB``, ``need 2, free 1 of 4 GPUs``; "" for a code with none."""
        if self.unit is Unit.NONE:
            return ""
        show, suffix = _SHOW[self.unit]
        text = f"need {show(self.need)}, free {show(max(self.free, 0))}"
        return (f"{text} of {show(self.capacity)}" if self.capacity else text) + suffix

    def __str__(self) -> str:
        where = f"node {self.node}" + (f" GPU {self.gpu}" if self.gpu >= 0 else "")
        amounts = f" ({self.amounts})" if self.amounts else ""
        return f"{self.code.value} on {where}{amounts}"


_SHOW: dict[Unit, tuple[Callable[[float], str], str]] = {  # unit -> (one amount, the words after all)
    Unit.GPUS: (lambda n: f"{n:g}", " GPUs"),
    Unit.GPU_MEMORY: (lambda n: format_size(int(n)), " GPU memory"),
    Unit.MEMORY: (lambda n: format_size(int(n)), " memory"),
    Unit.GPU_MILLI: (lambda n: f"{n / 10:g} %", " compute"),
    Unit.CPU_MILLI: (lambda n: f"{n / 1000:g}", " CPU"),
}
