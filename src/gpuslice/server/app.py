"""The REST API over the daemon: ``create_app(daemon, token) -> FastAPI``. Parse, call, present.

```text
GET  /v1/health                     liveness, version, machine, sharing mode, job counts
POST /v1/jobs                  🔑   submit (SubmitRequest) -> 201 JobOut
GET  /v1/jobs?state=&tenant=&limit= list, newest first
GET  /v1/jobs/{id}                  one job
POST /v1/jobs/{id}/cancel      🔑   cancel a pending or running job -> JobOut
GET  /v1/jobs/{id}/logs?follow=&stream=   stdout/stderr as text; follow streams until the job ends
GET  /v1/gpus                       each GPU: model, memory total/free, compute free, slices on it,
                                    health, and telemetry (utilisation, memory used, temperature, power)
POST /v1/gpus/{index}/health   🔑   mark a GPU unhealthy ({"healthy": false, "reason": "XID 79"}) or
                                    healthy again: an unhealthy GPU takes no new jobs -> GpuOut
GET  /metrics                       Prometheus text exposition (observe/metrics.py; docs/metrics.md)
GET  /v1/queue                      pending jobs in start order, each with why it waits
GET  /v1/tenants                    tenants: weight, quotas, graded-response settings, usage now
GET  /v1/tenants/{name}             one tenant (404 if neither set nor used)
PUT  /v1/tenants/{name}        🔑   set a tenant's weight, quotas and graded response
GET  /v1/events?job_id=&after=&limit=&kind=   the event log (kind=policy: loads, faults, detaches)
POST /v1/policies              🔑   verify a policy file's source, then swap it in (server/policy_api.py)
GET  /v1/policies                   what each policy family runs: file or built-in, faults, maps
DELETE /v1/policies/{family}   🔑   back to the built-in; GET/PUT …/{family}/maps/{map}[/{key}] 🔑 on PUT
GET  /  and  /dashboard             the web dashboard (server/dashboard/: static files over these reads)
```
🔑 = needs ``Authorization: Bearer <token>``. Every other ``/v1`` read but ``/v1/health`` needs the token
too, as a bearer or as the dashboard's cookie, unless the server runs with ``--public-reads`` (guard.py:
Host check, token before body, body cap, sign-in). Env values are never returned: names, masked values.
Every error is ``ErrorBody`` JSON: 400/404/405/409 for user errors (``detail`` says how to fix it;
``field`` names the field), 401 without the token, 403 when a request claims another user, 413 for a
body over the cap, 422 when the body does not match the schema, 429 when too many follow one log, 503
(with Retry-After) when the state file's disk is full or failing, or another process holds its lock
past the busy timeout, and nothing was changed; 500 only for bugs. ``/v1/health`` never touches the
state file: it says ``degraded`` and why while the file is locked or failing.

``POST /v1/jobs`` takes an ``Idempotency-Key`` header (1–200 printable ASCII characters): a retry with
the same key and body answers 200 with the job the first try made, never a second job; the same key
with another body is 409.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from http import HTTPStatus
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

import gpuslice
from gpuslice.errors import InvalidRequest, UserError
from gpuslice.server import dashboard, job_logs
from gpuslice.server.auth import check_bearer
from gpuslice.server.daemon import Daemon
from gpuslice.server.errors import ForbiddenUser, TooManyFollowers, http_status
from gpuslice.server.guard import Guard, new_sign_in_token
from gpuslice.server.models import (
    TENANT_PATTERN,
    ErrorBody,
    FieldError,
    JobOut,
    SubmitRequest,
    TenantIn,
    Text,
    job_out,
    named,
    spec_from_submit,
    tenant_from_body,
)
from gpuslice.server.policy_api import policy_router
from gpuslice.workload.job import JobState

__all__ = ["create_app"]

_log = logging.getLogger("gpuslice.server")
_bearer = HTTPBearer(auto_error=False, description="the token in the server's state directory")
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 422)
}
# Followers are coroutines, not threads (a few KiB each); the cap only bounds a client that opens
# connections in a loop.
MAX_LOG_FOLLOWERS = 1000
_DICT_FIELDS = frozenset({"env", "response"})  # request fields that are maps with user-chosen keys
_IDEMPOTENCY_KEY = r"^[\x21-\x7e]{1,200}$"  # printable ASCII, no spaces: published, and checked (422)



def _decimal(text: Any) -> Any:
    """An integer in a URL is written in decimal digits: "3.0" or "1e3" is refused (422), as the schema's
    ``integer`` is read for text; pydantic alone would take "3.0" and refuse "1e3"."""
    if isinstance(text, str) and not re.fullmatch(r"-?[0-9]+", text):
        raise ValueError(f"{text[:40]!r} is not an integer in decimal digits")
    return text


Decimal = BeforeValidator(_decimal)  # last in an Annotated: it runs before what is left of it
StateName = Literal["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "PREEMPTED"]


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


def create_app(
    daemon: Daemon,
    token: str | Callable[[], str | None],
    *,
    public_reads: bool = False,
    hosts: Iterable[str] | None = None,
    sign_in_token: str | None = None,
) -> FastAPI:
    """The FastAPI app serving ``daemon``; writes need ``token`` as a bearer, and so do reads unless
    ``public_reads``. ``token`` may be a function, asked at each request (the token file as it is now;
    None: no token, every call that needs one is refused). ``hosts``: the Host names accepted (None:
    any, for in-process clients); ``sign_in_token``: the one-time token of the dashboard URL
    (``app.state.sign_in_token``)."""
    app = FastAPI(
        title="gpuslice serve",
        version=gpuslice.__version__,
        description="A GPU job queue and sharing daemon for one machine.",
        docs_url=None,  # Swagger UI loads its scripts from a CDN: blank offline, and a remote script
        redoc_url=None,  # on the server's origin; the schema itself is at /openapi.json
    )
    started = time.time()
    app.state.stopping = threading.Event()  # set by the server at its first stop signal: followers end
    app.state.sign_in_token = sign_in_token or new_sign_in_token()
    app.add_middleware(_BugsAnswered)
    app.add_middleware(
        Guard, token=token, sign_in_token=app.state.sign_in_token, hosts=hosts, public_reads=public_reads
    )
    followers = 0

    def authorized(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
        header = f"{credentials.scheme} {credentials.credentials}" if credentials else None
        check_bearer(header, token() if callable(token) else token)

    Auth = Depends(authorized)

    @app.exception_handler(UserError)
    async def user_error(_: Request, err: UserError) -> JSONResponse:
        field = err.field if isinstance(err, FieldError) else None
        body = ErrorBody(detail=str(err), field=field, type=type(err).__name__)
        headers = {"WWW-Authenticate": "Bearer"} if http_status(err) == 401 else None
        if http_status(err) == 503:  # the state file is full, locked or failing: the request works later
            headers = {"Retry-After": str(getattr(err, "retry_after_seconds", 5))}
        return JSONResponse(body.model_dump(), status_code=http_status(err), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            body = ErrorBody(detail=f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}",
                             type="InvalidJSON")  # fmt: skip
            return JSONResponse(body.model_dump(), 400)
        loc = _field_path(first.get("loc", ()))
        about, msg = "", str(first["msg"])
        if loc and loc[0] in _DICT_FIELDS and len(loc) > 1:  # a key is user text, not a field name
            about = f"{'name' if loc[-1] == '[key]' else 'value of'} {str(loc[1])[:64]!r}: "
            loc = loc[:1]
        else:  # a field of several types: every member's complaint about it, once each
            same = [str(e["msg"]) for e in err.errors() if _field_path(e.get("loc", ())) == loc]
            msg = "; or ".join(dict.fromkeys(same)) or msg
        field = ".".join(str(p) for p in loc) or None
        detail = f"{field}: {about}{msg}" if field else msg
        return JSONResponse(ErrorBody(detail=detail, field=field, type="ValidationError").model_dump(), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        """Routing's own answers (404 no such path, 405 wrong method) in the one error format."""
        headers = dict(err.headers or {})
        if err.status_code == 405:
            allowed = {m for r in app.routes if r.matches(request.scope)[0] is not Match.NONE
                       for m in (getattr(r, "methods", None) or ())}  # fmt: skip
            headers["Allow"] = ", ".join(sorted(allowed))  # FastAPI's GET routes do not answer HEAD
            detail = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
        elif err.status_code == 404:
            detail = f"no such path {request.url.path!r}; the API is under /v1 (schema: /openapi.json)"
        else:
            detail = str(err.detail)
        kind = "".join(w.capitalize() for w in HTTPStatus(err.status_code).phrase.split())
        body = ErrorBody(detail=detail, type=kind)
        return JSONResponse(body.model_dump(), status_code=err.status_code, headers=headers)

    @app.get("/v1/health", response_model=Health)
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
            jobs=dict(daemon.job_counts),
        )

    answers: dict[int | str, dict[str, Any]] = {
        **_ERRORS,
        200: {"model": JobOut, "description": "a retry with the same Idempotency-Key and body: its job"},
        503: {"model": ErrorBody, "description": "the state file is full, locked or failing: nothing was "
              "stored; retry after Retry-After seconds"},
    }

    @app.post("/v1/jobs", status_code=201, response_model=JobOut, responses=answers, dependencies=[Auth])
    def submit(
        body: SubmitRequest,
        response: Response,
        idempotency_key: Annotated[
            str | None,
            Header(max_length=200, pattern=_IDEMPOTENCY_KEY,
                   description="a retry with the same key and body returns the same job"),
        ] = None,
    ) -> JobOut:
        if body.user is not None and body.user != daemon.user:
            raise ForbiddenUser(
                f"user: this server runs jobs as {daemon.user!r} and never switches users; "
                f"{body.user!r} should start their own server"
            )
        spec = spec_from_submit(body, daemon.user)
        key = None
        if idempotency_key is not None:
            digest = hashlib.sha256(json.dumps(body.model_dump(), sort_keys=True).encode()).hexdigest()
            key = (idempotency_key, digest)
        try:
            job, created = daemon.submit_once(spec, key)
        except InvalidRequest as err:  # the scheduler's "can never run here", with its field named
            raise named(err) from None
        if not created:
            response.status_code = 200  # a retry: the job the first try made
        return job_out(job)

    @app.get("/v1/jobs", response_model=list[JobOut], responses=_ERRORS)
    def list_jobs(
        state: Annotated[list[StateName] | None, Query()] = None,
        tenant: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10_000), Decimal] = 1000,
    ) -> list[JobOut]:
        states = [JobState(s) for s in state] if state else None
        jobs = daemon.store.jobs(states, tenant=tenant, limit=limit, newest_first=True)
        waiting = daemon.pending_reasons()  # a pending job's reason is why it waits now
        return [job_out(j, waiting.get(j.id)) for j in jobs]

    @app.get("/v1/jobs/{job_id}", response_model=JobOut, responses=_ERRORS)
    def get_job(job_id: str) -> JobOut:
        return job_out(daemon.store.get(job_id), daemon.pending_reasons().get(job_id))

    @app.post("/v1/jobs/{job_id}/cancel", response_model=JobOut, responses=_ERRORS, dependencies=[Auth])
    def cancel(job_id: str) -> JobOut:
        return job_out(daemon.cancel(job_id))

    @app.get("/v1/jobs/{job_id}/logs", responses={200: {"content": {"text/plain": {}}}, **_ERRORS, 429: {}})
    async def logs(
        job_id: str,
        follow: bool = False,
        stream: Literal["stdout", "stderr", "both"] = "both",
    ) -> StreamingResponse:
        """Async: a follower is a coroutine waiting on a timer, never a worker thread, and a client
        that goes away cancels it at once (Starlette watches for the disconnect)."""
        nonlocal followers
        daemon.store.get(job_id)  # 404 before streaming starts
        if follow and followers >= MAX_LOG_FOLLOWERS:
            raise TooManyFollowers(f"{followers} clients follow logs already; try again later")
        # Opened now, never through a link: a refused log is a 409 before any byte is sent.
        logs = job_logs.open_logs(daemon, job_id, ("stdout", "stderr") if stream == "both" else (stream,))
        if not follow:
            return StreamingResponse(job_logs.follow(daemon, job_id, logs, None), media_type="text/plain")
        followers += 1

        async def counted() -> AsyncIterator[bytes]:
            nonlocal followers
            try:
                async for chunk in job_logs.follow(daemon, job_id, logs, app.state.stopping):
                    yield chunk
            finally:
                followers -= 1

        return StreamingResponse(counted(), media_type="text/plain")

    @app.get("/v1/gpus", response_model=list[GpuOut])
    def gpus() -> list[GpuOut]:
        return [GpuOut(**g) for g in daemon.gpus()]

    @app.post("/v1/gpus/{index}/health", response_model=GpuOut, responses=_ERRORS, dependencies=[Auth])
    def gpu_health(index: Annotated[int, Decimal], body: GpuHealthIn) -> GpuOut:
        daemon.set_gpu_health(index, body.healthy, body.reason)
        return next(GpuOut(**g) for g in daemon.gpus() if g["index"] == index)

    @app.get("/metrics", responses={200: {"content": {"text/plain": {}}}})
    def metrics() -> Response:
        """Prometheus metrics; open without the token (a scraper has none; no job's command or env)."""
        return Response(daemon.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/queue", response_model=list[QueueEntry])
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

    @app.get("/v1/tenants", response_model=list[TenantOut])
    def tenants() -> list[TenantOut]:
        return [TenantOut(**t) for t in daemon.tenants()]

    @app.get("/v1/tenants/{name}", response_model=TenantOut, responses=_ERRORS)
    def get_tenant(name: Annotated[str, Path(pattern=TENANT_PATTERN)]) -> TenantOut:
        return TenantOut(**daemon.tenant(name))

    @app.put("/v1/tenants/{name}", response_model=TenantOut, responses=_ERRORS, dependencies=[Auth])
    def put_tenant(name: Annotated[str, Path(pattern=TENANT_PATTERN)], body: TenantIn) -> TenantOut:
        daemon.set_tenant(tenant_from_body(name, body))
        return TenantOut(**daemon.tenant(name))

    @app.get("/v1/events", response_model=list[EventOut], responses=_ERRORS)
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

    dashboard.mount(app)
    app.include_router(policy_router(daemon, authorized))

    def openapi() -> dict[str, Any]:
        """FastAPI's schema with the bounds of integer fields as integers (it writes ``le=8`` as 8.0)."""
        if app.openapi_schema is None:
            app.openapi_schema = _integer_bounds(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _integer_bounds(node: Any) -> Any:
    """``node`` (a schema, changed in place) with every whole-number bound of an integer as an int."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for key in _BOUNDS:
                value = node.get(key)
                if isinstance(value, float) and value.is_integer():
                    node[key] = int(value)
        for value in node.values():
            _integer_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _integer_bounds(value)
    return node


class _BugsAnswered:
    """A bug answers 500 (ErrorBody JSON) and the connection stays open for the client's next request:
    Starlette's own last-resort handler raises again after answering, and uvicorn then drops the
    connection. A bug after the response started (a stream) can only end that response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as err:
            if started:
                raise
            _log.exception("internal error")
            body = ErrorBody(detail=f"internal error (a bug in gpuslice): {err}", type=type(err).__name__)
            await JSONResponse(body.model_dump(), status_code=500)(scope, receive, send)


def _field_path(loc: Iterable[Any]) -> list[Any]:
    """A validation error's location as the request's field path: ("body", "command", 1) -> command, 1;
    pydantic's names for the members of a union ("constrained-str", "int") are dropped, a map's keys and
    their "[key]" marker kept (the caller words them)."""
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    if not parts:
        return []
    if parts[0] in _DICT_FIELDS:
        return parts[:3]
    return [parts[0], *[p for p in parts[1:] if isinstance(p, int)]]
