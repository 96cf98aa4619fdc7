"""Observability: metrics (Prometheus), GPU health, and anomaly detection over GPU telemetry.

Sits beside ``scheduler``: imports only the bottom layers and prometheus-client; ``server`` and ``k8s``
feed it. docs/metrics.md documents every metric.
"""

from gpuslice.observe.anomaly import Anomaly, SigmaDetector
from gpuslice.observe.health import GpuHealth, HealthBook, HealthChange
from gpuslice.observe.metrics import GpuState, PendingState, ServeMetrics, ServeSnapshot, SliceState

__all__ = [
    "Anomaly",
    "GpuHealth",
    "GpuState",
    "HealthBook",
    "HealthChange",
    "PendingState",
    "ServeMetrics",
    "ServeSnapshot",
    "SigmaDetector",
    "SliceState",
]
