"""One machine as the scheduler sees it: its GPUs and how they are wired. Plain data, no I/O.

``gpuslice.node.discovery`` builds a ``Machine`` from NVML or from a ``--simulate`` profile; the node
scheduler (``scheduler/node_scheduler.py``) only reads it. Nothing here imports NVML.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.node import MAX_GPUS_PER_NODE, NodeSpec
from gpuslice.hardware.topology import Topology
from gpuslice.units import GiB

__all__ = ["DEFAULT_CPU_MILLI", "DEFAULT_MEMORY_BYTES", "GpuInfo", "Machine"]

# Serve schedules GPUs only: jobs ask for no CPU or host memory, so these only need to exceed any
# request (1024 cores, 64 TiB); discovery may pass the real figures instead.
DEFAULT_CPU_MILLI = 1024 * 1000
DEFAULT_MEMORY_BYTES = 64 * 1024 * GiB


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU of the machine.

    ``model`` is the catalogue name (``gpuslice.hardware.gpu_models``: "H100", "A100-80GB", …) or the
    product name NVML reports when the catalogue does not know it. ``mig_model`` is the key of the GPU's
    MIG profile table (``gpuslice.hardware.mig``: "h100-80gb") or "" when the GPU cannot do MIG;
    ``mig_enabled`` says whether MIG mode is on now (then jobs get MIG instances, never the whole GPU).
    """

    index: int
    uuid: str
    model: str
    memory_bytes: int
    mig_enabled: bool = False
    mig_model: str = ""

    def __post_init__(self) -> None:
        if self.index < 0:
            raise InvalidRequest(f"GPU index {self.index}: must be 0 or more")
        if self.memory_bytes <= 0:
            raise InvalidRequest(f"GPU {self.index}: memory must be positive, got {self.memory_bytes}")
        if self.mig_enabled and not self.mig_model:
            raise InvalidRequest(f"GPU {self.index}: MIG is enabled but no MIG table (mig_model) is given")


@dataclass(frozen=True, slots=True)
class Machine:
    """The GPUs of one machine, indexed 0..n-1 in order, and their ``Topology`` when known.

    ``cpu_milli`` and ``memory_bytes`` are the host's capacity for the ledger; the defaults are larger
    than any job asks, because serve schedules GPUs only.
    """

    name: str
    gpus: tuple[GpuInfo, ...]
    topology: Topology | None = None
    cpu_milli: int = DEFAULT_CPU_MILLI
    memory_bytes: int = DEFAULT_MEMORY_BYTES

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))
        if not 1 <= len(self.gpus) <= MAX_GPUS_PER_NODE:
            raise InvalidRequest(
                f"machine {self.name!r}: {len(self.gpus)} GPUs; "
                f"gpuslice serve handles 1 to {MAX_GPUS_PER_NODE}"
            )
        for position, gpu in enumerate(self.gpus):
            if gpu.index != position:
                raise InvalidRequest(
                    f"machine {self.name!r}: GPU at position {position} has index {gpu.index}; "
                    "list GPUs in index order starting at 0"
                )
        if self.topology is not None and self.topology.n_gpus != len(self.gpus):
            raise InvalidRequest(
                f"machine {self.name!r}: topology {self.topology.name!r} has {self.topology.n_gpus} GPUs "
                f"but the machine has {len(self.gpus)}"
            )

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def models(self) -> tuple[str, ...]:
        """The distinct GPU models, sorted."""
        return tuple(sorted({g.model for g in self.gpus}))

    def node_spec(self) -> NodeSpec:
        """This machine as one ledger node, each GPU with its own memory.

        The ledger gives every GPU of a node one model; a machine with mixed GPUs is recorded with its
        first GPU's model, and the scheduler checks models per GPU itself.
        """
        return NodeSpec(
            name=self.name,
            cpu_milli=self.cpu_milli,
            memory_bytes=self.memory_bytes,
            gpu_count=self.gpu_count,
            gpu_model=self.gpus[0].model,
            gpu_memory_each=tuple(g.memory_bytes for g in self.gpus),
        )
