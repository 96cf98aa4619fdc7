"""The machine's routes of ``gpuslice serve`` (``server/app.py`` has the table of every route): health,
GPUs (and marking one unhealthy), Prometheus metrics, the queue, tenants and the event log."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field

import gpuslice
from gpuslice.server.daemon import Daemon
from gpuslice.server.models import (
    ERROR_RESPONSES,
    TENANT_PATTERN,
    Decimal,
    TenantIn,
    Text,
    tenant_from_body,
)

__all__ = ["EventOut", "GpuOut", "Health", "QueueEntry", "TenantOut", "cluster_router"]


class GpuJobOut(BaseModel):
    id: str
    memory_bytes: int
    compute_percent: int
    mig: str
    used_memory_bytes: int | None
    tenant: str = ""


class GpuOut(BaseModel):
    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    memory_free_bytes: int
    compute_free_percent: float
    external_memory_bytes: int
    jobs: list[GpuJobOut]
    healthy: bool = True
    unhealthy_reason: str | None = None
    # telemetry from the last monitor pass (NVML, or the simulated model); None before the first one
    utilization_percent: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    memory_used_bytes: int | None = None


class GpuHealthIn(BaseModel):
    """Mark a GPU unhealthy (no new jobs; running ones are reported) or healthy again."""

    model_config = ConfigDict(extra="forbid", strict=True)

    healthy: bool
    reason: Text = Field("", max_length=500, description='why, e.g. "XID 79"; shown in events and the queue')


class QueueEntry(BaseModel):
    position: int
    id: str
    priority: str
    tenant: str
    submitted_at: float
    reason: str


class TenantOut(BaseModel):
    name: str
    weight: float
    max_gpus: float | None
    max_gpu_memory_bytes: int | None
    response: dict[str, Any]
    running_jobs: int
    pending_jobs: int
    gpus_in_use: float = Field(
        description="GPUs its running jobs hold as quotas count them: whole GPUs 1 each, a share the "
        "larger of its memory and compute fractions of its GPU, a MIG instance its compute slices / 7"
    )
    gpu_memory_in_use_bytes: int
    never_fit_jobs: list[str] = Field(
        default_factory=list, description="its pending jobs that need more than its whole quota"
    )


class EventOut(BaseModel):
    id: int
    job_id: str
    time: float
    kind: str
    old_state: str | None
    new_state: str | None
    reason: str
    detail: dict[str, Any]


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    reason: str | None = Field(None, description="why degraded: the state file is locked or its disk fails")
    version: str
    machine: str
    gpus: int
    sharing: str
    user: str
    simulated: bool
    uptime_seconds: float
    jobs: dict[str, int]


def cluster_router(daemon: Daemon, authorized: Callable[..., None], started: float) -> APIRouter:
    """The machine's routes; ``authorized`` guards what changes state; ``started``: the server's start."""
    router = APIRouter()
    auth = Depends(authorized)

    @router.get("/v1/health", response_model=Health)
    def health() -> Health:
        """From memory only (job counts as of the daemon's last pass): it answers at once while the state
        file is locked or failing, and then says so."""
        store = daemon.store.condition
        return Health(
            status="ok" if store.ok else "degraded",
            reason=None if store.ok else f"state file {store.kind}: {store.reason}",
            version=gpuslice.__version__,
            machine=daemon.machine.name,
            gpus=daemon.machine.gpu_count,
            sharing=daemon.sharing,
            user=daemon.user,
            simulated=daemon.simulated,
            uptime_seconds=time.time() - started,
            jobs=dict(daemon.views.job_counts),
        )

    @router.get("/v1/gpus", response_model=list[GpuOut])
    def gpus() -> list[GpuOut]:
        return [GpuOut(**g) for g in daemon.views.gpus()]

    @router.post(
        "/v1/gpus/{index}/health", response_model=GpuOut, responses=ERROR_RESPONSES, dependencies=[auth]
    )
    def gpu_health(index: Annotated[int, Decimal], body: GpuHealthIn) -> GpuOut:
        daemon.set_gpu_health(index, body.healthy, body.reason)
        return next(GpuOut(**g) for g in daemon.views.gpus() if g["index"] == index)

    @router.get("/metrics", responses={200: {"content": {"text/plain": {}}}})
    def metrics() -> Response:
        """Prometheus metrics; open without the token (a scraper has none; no job's command or env)."""
        return Response(daemon.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/v1/queue", response_model=list[QueueEntry])
    def queue() -> list[QueueEntry]:
        return [
            QueueEntry(
                position=i,
                id=job.id,
                priority=job.spec.priority.name.lower(),
                tenant=job.spec.tenant,
                submitted_at=job.submitted_at,
                reason=reason,
            )
            for i, (job, reason) in enumerate(daemon.queue(), start=1)
        ]

    @router.get("/v1/tenants", response_model=list[TenantOut])
    def tenants() -> list[TenantOut]:
        return [TenantOut(**t) for t in daemon.views.tenants()]

    @router.get("/v1/tenants/{name}", response_model=TenantOut, responses=ERROR_RESPONSES)
    def get_tenant(name: Annotated[str, Path(pattern=TENANT_PATTERN)]) -> TenantOut:
        return TenantOut(**daemon.views.tenant(name))

    @router.put(
        "/v1/tenants/{name}", response_model=TenantOut, responses=ERROR_RESPONSES, dependencies=[auth]
    )
    def put_tenant(name: Annotated[str, Path(pattern=TENANT_PATTERN)], body: TenantIn) -> TenantOut:
        daemon.set_tenant(tenant_from_body(name, body))
        return TenantOut(**daemon.views.tenant(name))

    @router.get("/v1/events", response_model=list[EventOut], responses=ERROR_RESPONSES)
    def events(
        job_id: str | None = None,
        after: Annotated[int, Query(ge=0, le=2**62), Decimal] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000), Decimal] = 1000,
        kind: Annotated[str | None, Query(max_length=32, description="e.g. transition, policy")] = None,
    ) -> list[EventOut]:
        return [
            EventOut(
                id=event_id,
                job_id=e.job_id,
                time=e.time,
                kind=e.kind,
                old_state=e.old_state.value if e.old_state else None,
                new_state=e.new_state.value if e.new_state else None,
                reason=e.reason,
                detail=e.detail,
            )
            for event_id, e in daemon.store.events(job_id, after_id=after, limit=limit, kind=kind)
        ]

    return router
