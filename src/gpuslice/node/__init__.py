"""The node layer: discovery, launch, enforcement and monitoring on a real machine; it never decides.

Used by ``server`` and ``k8s``, never by ``scheduler`` (which reads only the plain ``Machine`` data).
"""

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.node.discovery import NoGpuDriver, discover, is_simulated
from gpuslice.node.enforcement import MpsDaemon, MpsUnavailable, SharingMode, job_env
from gpuslice.node.launcher import ExitStatus, LaunchedJob
from gpuslice.node.mig_manager import MigCommandFailed, MigManager, MigPermissionDenied
from gpuslice.node.monitor import Action, ActionKind, GradedResponse, ResponseConfig

__all__ = [
    "Action",
    "ActionKind",
    "ExitStatus",
    "GpuInfo",
    "GradedResponse",
    "LaunchedJob",
    "Machine",
    "MigCommandFailed",
    "MigManager",
    "MigPermissionDenied",
    "MpsDaemon",
    "MpsUnavailable",
    "NoGpuDriver",
    "ResponseConfig",
    "SharingMode",
    "discover",
    "is_simulated",
    "job_env",
]
