"""Trace replay: the openb experiment of the FGD paper."""

from gpuslice.sim.openb import DEFAULT_TUNE, ReplayResult, replay, unallocated_pct_at
from gpuslice.sim.trace import OpenbTrace, TracePod, load_trace

__all__ = [
    "DEFAULT_TUNE",
    "OpenbTrace",
    "ReplayResult",
    "TracePod",
    "load_trace",
    "replay",
    "unallocated_pct_at",
]
