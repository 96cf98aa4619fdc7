"""What took a GPU out, as a kind (for metrics and the health API) and a sentence (for people).

The kind is set where the fault is seen: the NVML event source knows an XID, the telemetry reader knows
an uncorrected-ECC count that rose, the API knows a mark made by hand. It travels typed to the
``gpuslice_gpu_faults_total{kind=…}`` metric; no sentence is parsed back into a kind.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["FaultKind", "GpuFault"]


class FaultKind(enum.Enum):
    XID = "xid"  # a critical XID event from NVML
    ECC = "ecc"  # uncorrected ECC errors rose
    NVML = "nvml"  # NVML itself failed (event wait, an unknown device)
    MANUAL = "manual"  # marked by hand (an operator, or a fault injected on a simulated GPU)


@dataclass(frozen=True, slots=True)
class GpuFault:
    kind: FaultKind
    reason: str

    def __str__(self) -> str:
        return self.reason
