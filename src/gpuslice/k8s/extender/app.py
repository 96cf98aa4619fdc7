"""The extender's HTTP face: the extender/v1 verbs kube-scheduler calls, as an ASGI app."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from contextlib import asynccontextmanager
from typing import Any

import fastapi
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from gpuslice.errors import GpusliceError, InvalidRequest
from gpuslice.k8s import extender_wire as wire
from gpuslice.k8s.extender import dashboard
from gpuslice.k8s.extender.bind_lock import BIND_BUDGET_S
from gpuslice.k8s.extender.claims import ClaimReader
from gpuslice.k8s.extender.cluster import pod_meta
from gpuslice.k8s.extender.kube import WatchEvent
from gpuslice.k8s.extender.snapshot import FragmentationHistory, cluster_figures, cluster_view
from gpuslice.k8s.extender.state import ClusterState
from gpuslice.k8s.pod_shape import check_pod
from gpuslice.observe.cluster_metrics import ClusterCollector
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
    """The extender's ASGI app: POST /filter, /prioritize, /preempt, /bind (extender/v1), GET /healthz,
    GET /metrics, and the cluster dashboard under GET /cluster/ (read-only; extender/dashboard).

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

    # No schema of its own: its bodies are kube-scheduler's extender/v1 types, read by extender_wire; a
    # FastAPI schema here would list /preempt alone, with no body.
    app = fastapi.FastAPI(
        title="gpuslice scheduler extender", lifespan=lifespan, openapi_url=None, docs_url=None,
        redoc_url=None,
    )  # fmt: skip

    # /filter and /prioritize carry every node name both ways, once per pod: plain Starlette routes
    # (no FastAPI parameter handling) with the orjson codec of extender_wire.
    reader = wire.ArgsReader()

    async def filter_(request: HttpRequest) -> Response:
        if starting():
            return Response(wire.filter_error(NOT_SYNCED), media_type=_JSON)
        try:
            body, names = reader.read(await request.body())
            result = state.filter(check_pod(wire.field(body, "Pod"), "Pod"), names)
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
            scores = state.scores(check_pod(wire.field(body, "Pod"), "Pod"), names)
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
            full = meta is None  # nodeCacheCapable sends victims by UID, else full pods
            candidates = _victims(wire.field(body, "NodeNameToVictims") if full else meta, full)
            uid = (lambda p: pod_meta(p)[2]) if full else (lambda p: str(wire.field(p, "UID")))
            uids = {n: [uid(p) for p in v["Pods"]] for n, v in candidates.items()}
            kept = state.preempt(check_pod(wire.field(body, "Pod"), "Pod"), uids)
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

    async def bind(request: HttpRequest) -> Response:
        """Every answer is 200 with ``Error``: kube-scheduler reads an extender's body only on a 200
        (HTTPExtender.send), and turns a non-empty Error into the pod's bind failure, which shows in its
        FailedScheduling event; on any other status it shows only the code. The answer is due
        ``BIND_BUDGET_S`` after arrival, however long the request queues for a worker thread."""
        deadline = time.monotonic() + BIND_BUDGET_S
        if starting():
            return Response(wire.encode({"Error": NOT_SYNCED}), media_type=_JSON)
        try:
            body = wire.decode(await request.body())
        except GpusliceError as err:
            error = f"gpuslice extender: unreadable ExtenderBindingArgs: {err}"
            return Response(wire.encode({"Error": error}), media_type=_JSON)
        error = await run_in_threadpool(
            state.bind,
            str(wire.field(body, "PodNamespace") or "default"),
            str(wire.field(body, "PodName") or ""),
            str(wire.field(body, "PodUID") or ""),
            str(wire.field(body, "Node") or ""),
            deadline,
        )
        return Response(wire.encode({"Error": error}), media_type=_JSON)

    app.add_route("/bind", bind, methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        if starting():
            return JSONResponse(
                {"ok": False, "reason": NOT_SYNCED, "conflicts": state.conflicts}, status_code=503
            )
        return JSONResponse({"ok": True, "conflicts": state.conflicts})

    metrics = instrument_extender(app)  # GET /metrics; each verb's latency and result (k8s_metrics.py)
    # GET /cluster/: the read-only cluster dashboard, over kubectl port-forward (extender/dashboard)
    history = FragmentationHistory()
    claims = ClaimReader(getattr(state.api, "list_resource_claims", None))  # None: a test's API
    dashboard.mount(app, lambda: cluster_view(state, history, claims))
    # and the ledger's per-node and pending series on /metrics, sampling the same history
    metrics.registry.register(ClusterCollector(lambda: cluster_figures(state, history)))
    app.state.metrics = metrics  # also served on a port of its own (gpuslice k8s extender --metrics-port)
    return app


def _victims(value: Any, full: bool) -> dict[str, dict[str, Any]]:
    """NodeNameToVictims / NodeNameToMetaVictims checked: node name -> {"Pods": [...], ...}, each pod an
    object (a full Pod, checked as one, or {"UID": str}); InvalidRequest naming what is wrong."""
    name = "NodeNameToVictims" if full else "NodeNameToMetaVictims"
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name}: must be an object of node names")
    out: dict[str, dict[str, Any]] = {}
    for node, victims in value.items():
        victims = victims if victims is not None else {}
        if not isinstance(victims, dict):
            raise InvalidRequest(f"{name}[{node!r}]: must be an object with Pods")
        pods = wire.field(victims, "Pods") or []
        if not isinstance(pods, list):
            raise InvalidRequest(f"{name}[{node!r}].Pods: must be a list")
        for i, pod in enumerate(pods):
            where = f"{name}[{node!r}].Pods[{i}]"
            if full:
                check_pod(pod, where)
            elif not isinstance(pod, dict) or not isinstance(wire.field(pod, "UID"), str):
                raise InvalidRequest(f"{where}: must be an object with a string UID")
        pdb = wire.field(victims, "NumPDBViolations")
        if pdb is not None and (not isinstance(pdb, int) or isinstance(pdb, bool)):
            raise InvalidRequest(f"{name}[{node!r}].NumPDBViolations: must be a whole number")
        out[node] = {**victims, "Pods": pods}
    return out
