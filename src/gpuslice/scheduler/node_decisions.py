"""What the node scheduler tells serve's daemon: start this job on these GPUs, preempt that one, and how
each GPU is used (for ``gpuslice gpus``). Plain data."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GpuUsage", "MigAssignment", "PreemptJob", "StartJob"]


@dataclass(frozen=True)
class MigAssignment:
    """A MIG instance of ``profile`` at memory slot ``start`` on GPU ``gpu``."""

    gpu: int
    profile: str
    start: int


@dataclass(frozen=True)
class StartJob:
    job_id: str
    gpus: tuple[int, ...]
    mig: MigAssignment | None = None


@dataclass(frozen=True)
class PreemptJob:
    job_id: str
    for_job: str
    grace_seconds: float


@dataclass(frozen=True)
class GpuUsage:
    """One GPU as ``gpuslice gpus`` shows it. Memory "free" counts whole-GPU jobs as using all of it."""

    index: int
    model: str
    memory_total_bytes: int
    memory_free_bytes: int
    compute_free_milli: int
    job_ids: tuple[str, ...]
    external_bytes: int = 0
    mig_enabled: bool = False
    mig_slots: str = ""  # '#' taken, '.' free, slot 0 first; "" when MIG is off
    unhealthy_reason: str = ""  # why it takes no new jobs; "" when healthy
