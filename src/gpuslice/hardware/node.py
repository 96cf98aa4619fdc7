"""A machine: CPU, main memory and a number of identical GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.gpu_models import GPU_MODELS
from gpuslice.hardware.mig import MigGpu, mig_gpu

__all__ = ["MAX_GPUS_PER_NODE", "MAX_GPU_INDEX", "NodeSpec"]

# Eight is the most GPUs any node in openb (and any HGX/DGX board) carries; the ledger pads to this.
MAX_GPUS_PER_NODE = 8
# The largest GPU index a user may name (nvidia-smi -i, a GPU to mark): NVML numbers devices with an
# unsigned int. A number past the machine's GPUs is the machine's to refuse ("no GPU 12").
MAX_GPU_INDEX = 2**32 - 1


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Capacity of one node. ``gpu_model`` is "" for a CPU-only node.

    ``gpu_memory_bytes`` is the memory of each GPU; left out, it comes from the GPU model catalogue
    (0 for a model the catalogue does not know, so requests for GPU memory never fit there).
    ``gpu_memory_each`` gives each GPU its own memory instead (a machine with mixed GPUs).
    ``mig_gpus``: how many of its GPUs, the first ones, are in MIG mode (sim; the model needs a MIG
    table, ``hardware.mig``): they serve MIG instances only.
    """

    name: str
    cpu_milli: int
    memory_bytes: int
    gpu_count: int
    gpu_model: str
    gpu_memory_bytes: int | None = None
    gpu_memory_each: tuple[int, ...] | None = None
    mig_gpus: int = 0

    def __post_init__(self) -> None:
        if self.gpu_memory_each is not None:
            if len(self.gpu_memory_each) != self.gpu_count or min(self.gpu_memory_each, default=0) < 0:
                raise InvalidRequest(
                    f"node {self.name!r}: gpu_memory_each needs one non-negative size per GPU "
                    f"({self.gpu_count}), got {len(self.gpu_memory_each)}"
                )
            object.__setattr__(self, "gpu_memory_bytes", max(self.gpu_memory_each, default=0))
        if self.gpu_memory_bytes is None:
            known = GPU_MODELS.get(self.gpu_model)
            object.__setattr__(self, "gpu_memory_bytes", known.memory_bytes if known else 0)
        if self.gpu_memory_bytes < 0:
            raise InvalidRequest(f"node {self.name!r}: GPU memory cannot be negative")
        if self.cpu_milli < 0 or self.memory_bytes < 0:
            raise InvalidRequest(f"node {self.name!r}: CPU and memory capacity cannot be negative")
        if not 0 <= self.gpu_count <= MAX_GPUS_PER_NODE:
            raise InvalidRequest(
                f"node {self.name!r}: {self.gpu_count} GPUs; a node holds 0 to {MAX_GPUS_PER_NODE}"
            )
        if self.gpu_count > 0 and not self.gpu_model:
            raise InvalidRequest(f"node {self.name!r}: has {self.gpu_count} GPUs but no GPU model")
        if not 0 <= self.mig_gpus <= self.gpu_count:
            raise InvalidRequest(
                f"node {self.name!r}: {self.mig_gpus} GPUs in MIG mode, but it has {self.gpu_count}"
            )
        if self.mig_gpus:
            mig_gpu(self.gpu_model)  # UnknownMigGpu (a user error) names the models that have a table

    @property
    def mig_geometry(self) -> MigGpu | None:
        """The MIG table of this node's MIG-mode GPUs; None when it has none."""
        return mig_gpu(self.gpu_model) if self.mig_gpus else None
