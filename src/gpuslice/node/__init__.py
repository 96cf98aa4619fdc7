"""The node layer: discovery, launch, enforcement and monitoring on a real machine; it never decides.

Used by ``server`` and ``k8s``, never by ``scheduler`` (which reads only the plain ``Machine`` data).
"""

from gpuslice.node.machine import GpuInfo, Machine

__all__ = ["GpuInfo", "Machine"]
