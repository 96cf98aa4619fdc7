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

import logging
import threading
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

import gpuslice
from gpuslice.errors import UserError
from gpuslice.server import dashboard
from gpuslice.server.auth import check_bearer
from gpuslice.server.cluster_api import cluster_router
from gpuslice.server.daemon import Daemon
from gpuslice.server.errors import http_status
from gpuslice.server.guard import Guard, new_sign_in_token
from gpuslice.server.job_api import job_router
from gpuslice.server.models import (
    ErrorBody,
    FieldError,
)
from gpuslice.server.policy_api import policy_router

__all__ = ["create_app"]

_log = logging.getLogger("gpuslice.server")
_bearer = HTTPBearer(auto_error=False, description="the token in the server's state directory")
_DICT_FIELDS = frozenset({"env", "response"})  # request fields that are maps with user-chosen keys


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

    def authorized(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
        header = f"{credentials.scheme} {credentials.credentials}" if credentials else None
        check_bearer(header, token() if callable(token) else token)

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
            allowed = _methods_at(app.routes, request.scope)
            headers["Allow"] = ", ".join(sorted(allowed))  # FastAPI's GET routes do not answer HEAD
            detail = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
        elif err.status_code == 404:
            detail = f"no such path {request.url.path!r}; the API is under /v1 (schema: /openapi.json)"
        else:
            detail = str(err.detail)
        kind = "".join(w.capitalize() for w in HTTPStatus(err.status_code).phrase.split())
        body = ErrorBody(detail=detail, type=kind)
        return JSONResponse(body.model_dump(), status_code=err.status_code, headers=headers)

    app.include_router(cluster_router(daemon, authorized, started))
    app.include_router(job_router(daemon, authorized, app.state.stopping))
    dashboard.mount(app)
    app.include_router(policy_router(daemon, authorized))

    def openapi() -> dict[str, Any]:
        """FastAPI's schema with the bounds of integer fields as integers (it writes ``le=8`` as 8.0)."""
        if app.openapi_schema is None:
            app.openapi_schema = _integer_bounds(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _methods_at(routes: Iterable[Any], scope: Any) -> set[str]:
    """The methods the routes at ``scope``'s path answer, through included routers (FastAPI keeps an
    included router whole, as one route that matches only partly, not its routes one by one)."""
    methods: set[str] = set()
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            methods |= _methods_at(included.routes, scope)
        elif route.matches(scope)[0] is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return methods


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
