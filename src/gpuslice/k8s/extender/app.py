"""The extender's HTTP face: the extender/v1 verbs kube-scheduler calls, as an ASGI app."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from contextlib import asynccontextmanager
from typing import Any

import fastapi
from fastapi.responses import JSONResponse
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from gpuslice.errors import GpusliceError
from gpuslice.k8s import extender_wire as wire
from gpuslice.k8s.extender.cluster import pod_meta
from gpuslice.k8s.extender.kube import WatchEvent
from gpuslice.k8s.extender.state import ClusterState
from gpuslice.observe.k8s_metrics import instrument_extender

__all__ = ["SERVER_OPTIONS", "create_app"]

log = logging.getLogger(__name__)

# uvicorn.run options for the extender: the C HTTP parser (httptools) and event loop (uvloop) the k8s
# extra installs, cheaper per 100 kB body than the pure-Python h11 and asyncio; no access log line for
# the two calls kube-scheduler makes per pod (errors are still logged).
SERVER_OPTIONS: dict[str, Any] = {"http": "httptools", "loop": "uvloop", "access_log": False}

_JSON = "application/json"
NOT_SYNCED = "gpuslice extender is starting: waiting for its first full list of nodes and pods"


def create_app(state: ClusterState, events: Iterable[WatchEvent] | None = None) -> Any:
    """The extender's ASGI app: POST /filter, /prioritize, /preempt, /bind (extender/v1), GET /healthz.

    ``events``: a watch source followed on a daemon thread from startup (``KubernetesApi.events()``).
    With one, no verb decides until the state has taken in the first full lists of nodes and pods
    (``ClusterState.synced``): /filter and /bind answer an error kube-scheduler retries after its
    backoff, /preempt offers nothing, and /healthz answers 503 (not ready).
    """
    gated = events is not None

    def starting() -> bool:
        return gated and not state.synced

    @asynccontextmanager
    async def lifespan(app: fastapi.FastAPI) -> Any:
        if events is not None:
            threading.Thread(target=state.follow, args=(events,), daemon=True, name="watch").start()
        yield

    app = fastapi.FastAPI(title="gpuslice scheduler extender", lifespan=lifespan)

    # /filter and /prioritize carry every node name both ways, once per pod: plain Starlette routes
    # (no FastAPI parameter handling) with the orjson codec of extender_wire.
    reader = wire.ArgsReader()

    async def filter_(request: HttpRequest) -> Response:
        if starting():
            return Response(wire.filter_error(NOT_SYNCED), media_type=_JSON)
        try:
            body, names = reader.read(await request.body())
            result = state.filter(wire.field(body, "Pod") or {}, names)
            reader.remember(result.passed)  # what kube-scheduler sends to /prioritize next
            nodes = wire.field(body, "Nodes") if wire.field(body, "NodeNames") is None else None
        except (GpusliceError, ValueError) as err:
            return Response(wire.filter_error(str(err)), media_type=_JSON)
        return Response(
            wire.filter_reply(
                result.passed, result.failed, result.unresolvable, nodes if isinstance(nodes, dict) else None
            ),
            media_type=_JSON,
        )

    async def prioritize(request: HttpRequest) -> Response:
        try:
            body, names = reader.read(await request.body())
            scores = state.scores(wire.field(body, "Pod") or {}, names)
        except (GpusliceError, ValueError):
            # kube-scheduler ignores a failed prioritize call (prioritizeNodes in schedule_one.go): it
            # costs only this extender's scores, never the pod's scheduling
            return Response(wire.encode([]), media_type=_JSON)
        return Response(wire.host_priorities(names, scores), media_type=_JSON)

    app.add_route("/filter", filter_, methods=["POST"])
    app.add_route("/prioritize", prioritize, methods=["POST"])

    @app.post("/preempt")
    async def preempt(request: fastapi.Request) -> JSONResponse:
        if starting():
            return JSONResponse({"NodeNameToMetaVictims": {}})
        try:
            body = wire.decode(await request.body())
            meta = wire.field(body, "NodeNameToMetaVictims")
            if meta is not None:  # nodeCacheCapable: victims by UID
                candidates = {n: (v or {}) for n, v in meta.items()}
                uids = {
                    n: [str(wire.field(p, "UID")) for p in wire.field(v, "Pods") or []]
                    for n, v in candidates.items()
                }
            else:  # full pods
                candidates = {n: (v or {}) for n, v in (wire.field(body, "NodeNameToVictims") or {}).items()}
                uids = {
                    n: [pod_meta(p)[2] for p in wire.field(v, "Pods") or []] for n, v in candidates.items()
                }
            kept = state.preempt(wire.field(body, "Pod") or {}, uids)
        except (GpusliceError, ValueError, AttributeError):
            # ExtenderPreemptionResult has no error field: no candidates means no preemption for now
            log.warning("unreadable preemption request", exc_info=True)
            return JSONResponse({"NodeNameToMetaVictims": {}})
        return JSONResponse(
            {
                "NodeNameToMetaVictims": {
                    n: {
                        "Pods": [{"UID": u} for u in victims],
                        "NumPDBViolations": int(wire.field(candidates[n], "NumPDBViolations") or 0),
                    }
                    for n, victims in kept.items()
                }
            }
        )

    @app.post("/bind")
    def bind(body: dict[str, Any]) -> JSONResponse:
        if starting():
            return JSONResponse({"Error": NOT_SYNCED})
        error = state.bind(
            str(wire.field(body, "PodNamespace") or "default"),
            str(wire.field(body, "PodName") or ""),
            str(wire.field(body, "PodUID") or ""),
            str(wire.field(body, "Node") or ""),
        )
        return JSONResponse({"Error": error})

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        if starting():
            return JSONResponse(
                {"ok": False, "reason": NOT_SYNCED, "conflicts": state.conflicts}, status_code=503
            )
        return JSONResponse({"ok": True, "conflicts": state.conflicts})

    instrument_extender(app)  # GET /metrics; latency and result of every verb (observe/k8s_metrics.py)
    return app
