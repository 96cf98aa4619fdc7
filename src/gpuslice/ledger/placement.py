"""What crosses every boundary: a Placement (where a request went) or a Refusal (why it could not)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuslice.workload.request import Request

if TYPE_CHECKING:
    from gpuslice.ledger.mig import MigHold

__all__ = ["Placement", "Refusal", "RefusalCode"]


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

    @property
    def curable(self) -> bool:
        """Could evicting lower-priority work make this refusal go away? Not when the node itself, or
        the request against it, rules it out (Kubernetes: ``UnschedulableAndUnresolvable``, which sends
        no node of it to preemption); every other refusal is about what others hold. The one home of
        this rule: the extender's unresolvable nodes and its preemption candidates read it."""
        return self not in _UNCURABLE


_UNCURABLE = frozenset({
    RefusalCode.NO_SUCH_NODE, RefusalCode.GPU_MODEL_NOT_ALLOWED, RefusalCode.WRONG_GPU_COUNT,
    RefusalCode.NO_SUCH_GPU, RefusalCode.DUPLICATE_GPU,
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused reservation. The ledger is unchanged when it returns one."""

    code: RefusalCode
    node: int
    gpu: int = -1
    need: int = 0
    free: int = 0

    def __str__(self) -> str:
        where = f"node {self.node}" + (f" GPU {self.gpu}" if self.gpu >= 0 else "")
        amounts = f" (need {self.need}, free {self.free})" if self.need or self.free else ""
        return f"{self.code.value} on {where}{amounts}"
