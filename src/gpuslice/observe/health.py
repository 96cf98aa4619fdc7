"""Health of each GPU: healthy, or unhealthy with a reason (an XID, an ECC error, an NVML failure, or a
mark set by hand), and since when.

```text
NVML fault (node/telemetry.py) ─┐
POST /v1/gpus/{i}/health ───────┴─► HealthBook.mark(gpu, healthy, reason, now, manual=…) → change | None
    the daemon applies a change: scheduler.set_gpu_health, an event for the GPU and one per job
    running on it, gpuslice_gpu_faults_total
```

A GPU stays unhealthy until it is marked healthy (by hand, after the cause is dealt with): XIDs and ECC
errors do not heal by themselves, and NVIDIA's device plugin likewise never marks a device healthy
again. A new fault on an unhealthy GPU replaces its reason (and is a change: it is reported); the same
fault again is not.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.hardware.faults import FaultKind

__all__ = ["GpuHealth", "HealthBook", "HealthChange"]


@dataclass(frozen=True, slots=True)
class GpuHealth:
    healthy: bool = True
    reason: str = ""  # "" when healthy
    kind: str = ""  # xid | ecc | nvml | manual; "" when healthy
    since: float | None = None  # when it became unhealthy


@dataclass(frozen=True, slots=True)
class HealthChange:
    gpu: int
    before: GpuHealth
    after: GpuHealth


class HealthBook:
    """The health of ``gpu_count`` GPUs, all healthy at first. Not thread-safe: the daemon's lock
    guards it."""

    def __init__(self, gpu_count: int) -> None:
        self._state = [GpuHealth() for _ in range(gpu_count)]

    def __getitem__(self, gpu: int) -> GpuHealth:
        return self._state[gpu]

    def __len__(self) -> int:
        return len(self._state)

    def restore(self, gpu: int, health: GpuHealth) -> None:
        """Set a GPU's health as stored before a restart (no change is reported: nothing changed)."""
        self._state[gpu] = health

    def unhealthy(self) -> dict[int, GpuHealth]:
        return {g: h for g, h in enumerate(self._state) if not h.healthy}

    def mark(
        self, gpu: int, healthy: bool, reason: str, now: float, *, kind: FaultKind = FaultKind.MANUAL
    ) -> HealthChange | None:
        """Record a GPU's health; the change, or None when nothing changed. ``kind``: what the fault is
        (a mark by hand is MANUAL, even when its text names an XID, so injected faults never pass for
        real ones). IndexError for a GPU that does not exist (callers check first)."""
        before = self._state[gpu]
        if healthy:
            if before.healthy:
                return None
            after = GpuHealth()
        else:
            reason = reason.strip() or "marked unhealthy"
            if not before.healthy and before.reason == reason:
                return None
            since = now if before.healthy else before.since
            after = GpuHealth(False, reason, kind.value, since)
        self._state[gpu] = after
        return HealthChange(gpu, before, after)
