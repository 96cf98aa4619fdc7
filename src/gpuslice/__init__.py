"""gpuslice: open GPU sharing and scheduling.

The public API, layer by layer (DESIGN.md): sizes and GPU/node data at the bottom, the columnar
ledger above them, placement policies and the placer that applies their advice, and the openb replay.
"""

from gpuslice.errors import GpusliceError, InternalError, UserError
from gpuslice.hardware import GPU_MODELS, GpuModel, NodeSpec
from gpuslice.ledger import Ledger, LedgerView, Placement, Refusal, RefusalCode
from gpuslice.policies import PLACEMENT, PlacementOps, PolicyContext, TieBreak, make_policy
from gpuslice.scheduler import Placer, Unplaced
from gpuslice.units import format_size, parse_size
from gpuslice.workload import Request, RequestKind, TargetWorkload

__version__ = "0.1.0"

__all__ = [
    "GPU_MODELS",
    "PLACEMENT",
    "GpuModel",
    "GpusliceError",
    "InternalError",
    "Ledger",
    "LedgerView",
    "NodeSpec",
    "Placement",
    "PlacementOps",
    "Placer",
    "PolicyContext",
    "Refusal",
    "RefusalCode",
    "Request",
    "RequestKind",
    "TargetWorkload",
    "TieBreak",
    "Unplaced",
    "UserError",
    "__version__",
    "format_size",
    "make_policy",
    "parse_size",
]
