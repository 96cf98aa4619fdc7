"""Mutating admission webhook: route gpuslice pods to the gpuslice scheduler, fill defaults, refuse the
impossible with a message that says what to change.

```text
POST /mutate   AdmissionReview v1 {request: {uid, kind, operation, object: Pod}}
               pod names no gpuslice.io resource      -> allowed, no patch
               defaults (below) + schedulerName        -> allowed, JSONPatch (base64) of the changes
               request impossible                      -> allowed: false, status {code 400, message}
```

Defaults, on the one container that asks for gpuslice resources:

* ``gpuslice.io/gpu: 1`` when only ``gpumem``/``gpucores`` are given (HAMi users write it this way);
* ``limits`` copied from ``requests`` for gpuslice resources: extended resources must be limits;
* ``spec.schedulerName`` set to the gpuslice scheduler when it is empty or ``default-scheduler``. A pod
  that names some other scheduler is refused: nothing else would write the decision the device plugin
  needs, so the pod would fail at Allocate.

Under ``--dra-claims label|all`` a chosen pod (label ``gpuslice.io/dra: "true"``, or every one) is
rewritten into a ResourceClaimTemplate instead (``k8s/dra/rewrite.py``): its gpuslice resources go,
a claim from the template and the DRA allocator's scheduling gate come, the scheduler name is left
as it is (kube-scheduler binds DRA pods). That is the webhook's one side effect: it creates the
template when missing (not on a dry run); a failure to create it refuses the pod with the reason.

Only pod CREATE is mutated; anything else is allowed unchanged. The one piece of cluster state it reads
is which MIG profiles the cluster's GPUs offer (``k8s/mig_inventory.py``: node inventories and DRA
slices, cached): a MIG pod no GPU here could run is refused, naming the profiles there are. Whether a GPU
of that size is free today is the extender's filter and its pending-pod Event to say; the webhook refuses
what no node could ever satisfy.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fastapi
from fastapi.responses import JSONResponse

from gpuslice.errors import InvalidRequest, UnknownPolicy, UserError
from gpuslice.hardware.mig import MIG_GPUS
from gpuslice.k8s.annotations import (
    ANNOTATION_PLACEMENT_POLICY,
    DOMAIN,
    RESOURCE_GPU,
    RESOURCE_GPUCORES,
    RESOURCE_GPUMEM,
    SCHEDULER_NAME,
    asks_for_gpuslice,
    pod_gpu_request,
)
from gpuslice.k8s.dra.rewrite import DraClaims, TemplateStore, claim_templates, rewrite_ops, wants_rewrite
from gpuslice.k8s.mig_inventory import InventoryUnavailable, MigInventory
from gpuslice.k8s.pod_shape import check_pod, check_review, strict_json
from gpuslice.policies import placement_policy

__all__ = [
    "DEFAULT_SCHEDULER",
    "DraRewrite",
    "TemplateUnavailable",
    "admit",
    "create_app",
    "mutate_pod",
    "run",
]

DEFAULT_SCHEDULER = "default-scheduler"  # what the API server fills in when a pod names none
# A TLS handshake not finished this long after the connection is dropped. The API server gives a webhook
# call 10 s at most (timeoutSeconds' default and ceiling is 30 s), so a slower handshake serves no one;
# a client that connects and sends nothing holds one connection only this long.
TLS_HANDSHAKE_TIMEOUT_S = 10.0


class TemplateUnavailable(UserError):
    """The claim template of a DRA-rewritten pod could not be created (API refusal or outage)."""


def _escape(key: str) -> str:
    """A map key as one JSON-Pointer segment (RFC 6901): '~' -> '~0', '/' -> '~1'."""
    return key.replace("~", "~0").replace("/", "~1")


def _every_mig_profile() -> frozenset[str]:
    """Without API access: every profile of every MIG table gpuslice knows (not this cluster's)."""
    return frozenset(p.name for gpu in MIG_GPUS.values() for p in gpu.profiles)


@dataclass(frozen=True)
class DraRewrite:
    """The webhook's DRA rewrite setting: which pods, and where templates are created."""

    mode: DraClaims
    templates: TemplateStore | None = None


def mutate_pod(
    pod: Mapping[str, Any],
    scheduler_name: str = SCHEDULER_NAME,
    *,
    dra: DraRewrite | None = None,
    namespace: str = "",
    dry_run: bool = False,
    mig: MigInventory | None = None,
) -> list[dict[str, Any]]:
    """The JSONPatch operations for ``pod``; InvalidRequest (with the fix in its message) if impossible.
    With ``dra`` a chosen pod is rewritten into a claim template created in ``namespace``. A MIG profile
    is checked against ``mig`` (this cluster's GPUs), or every known MIG table without it."""
    if not asks_for_gpuslice(pod):
        return []
    spec = pod.get("spec") or {}
    ops: list[dict[str, Any]] = []
    for group in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(group) or []):
            ops += _container_defaults(f"/spec/{group}/{i}", container)
    patched = _apply(pod, ops)
    ask = pod_gpu_request(patched)  # raises with a message that names the container and the fix
    for one in (*ask.containers, *ask.init):
        if not one.mig_profile:
            continue
        offered = mig.profiles() if mig is not None else _every_mig_profile()
        if one.mig_profile not in offered:
            where = "no GPU in this cluster offers" if mig is not None else "no GPU has"
            known = ", ".join(sorted(offered)) or "none (no GPU here is in MIG mode)"
            raise InvalidRequest(
                f"{DOMAIN}/mig-{one.mig_profile}: {where} MIG profile {one.mig_profile!r}; offered: {known}"
            )
    if ask.policy:
        try:
            placement_policy(ask.policy)
        except UnknownPolicy as err:
            raise InvalidRequest(f"annotation {ANNOTATION_PLACEMENT_POLICY}: {err}") from None
    if dra is not None and wants_rewrite(pod, dra.mode) and ask.wants_gpu:
        where = namespace or (pod.get("metadata") or {}).get("namespace") or "default"
        templates = claim_templates(ask, where)  # one per asking app container
        if not dry_run and dra.templates is not None:
            for template in {t["metadata"]["name"]: t for t in templates}.values():
                try:
                    dra.templates.ensure_template(template["metadata"]["namespace"], template)
                except Exception as err:  # the API server refused or is unreachable: say so on the pod
                    raise TemplateUnavailable(
                        f"could not create ResourceClaimTemplate {template['metadata']['name']}: {err}"
                    ) from None
        return rewrite_ops(patched, ask, [t["metadata"]["name"] for t in templates])
    current = spec.get("schedulerName") or ""
    if current in ("", DEFAULT_SCHEDULER):
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    elif current != scheduler_name:
        raise InvalidRequest(
            f"the pod asks for {DOMAIN} resources but names scheduler {current!r}; only {scheduler_name!r} "
            "places gpuslice GPUs: remove spec.schedulerName or set it to that"
        )
    return ops


def _container_defaults(path: str, container: Mapping[str, Any]) -> list[dict[str, Any]]:
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    ours = {k: v for k, v in requests.items() if k.startswith(f"{DOMAIN}/")}
    ours |= {k: v for k, v in limits.items() if k.startswith(f"{DOMAIN}/")}
    if not ours:
        return []
    wanted = dict(ours)
    if RESOURCE_GPU not in wanted and (RESOURCE_GPUMEM in wanted or RESOURCE_GPUCORES in wanted):
        wanted[RESOURCE_GPU] = "1"
    missing = {k: v for k, v in wanted.items() if k not in limits}
    if not missing:
        return []
    ops: list[dict[str, Any]] = []
    if "resources" not in container:
        ops.append({"op": "add", "path": f"{path}/resources", "value": {}})
    if "limits" not in resources or resources.get("limits") is None:
        ops.append({"op": "add", "path": f"{path}/resources/limits", "value": {}})
    ops += [
        {"op": "add", "path": f"{path}/resources/limits/{_escape(k)}", "value": str(v)}
        for k, v in sorted(missing.items())
    ]
    return ops


def _apply(pod: Mapping[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``pod`` with the "add" operations applied (the only kind mutate_pod emits)."""
    out = json.loads(json.dumps(pod))
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target[last] = json.loads(json.dumps(op["value"]))
    return out


def admit(
    review: Mapping[str, Any],
    scheduler_name: str = SCHEDULER_NAME,
    dra: DraRewrite | None = None,
    mig: MigInventory | None = None,
) -> dict[str, Any]:
    """An AdmissionReview v1 response for ``review`` (the API server's request, as JSON)."""
    request = review.get("request") or {}
    uid = request.get("uid", "")
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    kind = (request.get("kind") or {}).get("kind")
    if kind == "Pod" and request.get("operation", "CREATE") == "CREATE":
        try:
            ops = mutate_pod(
                check_pod(request.get("object"), "request.object"),
                scheduler_name,
                dra=dra,
                namespace=str(request.get("namespace") or ""),
                dry_run=request.get("dryRun") is True,
                mig=mig,
            )
        except InvalidRequest as err:
            response["allowed"] = False
            response["status"] = {"code": 400, "reason": "BadRequest", "message": f"gpuslice: {err}"}
        except (TemplateUnavailable, InventoryUnavailable) as err:
            response["allowed"] = False
            response["status"] = {"code": 503, "reason": "ServiceUnavailable", "message": f"gpuslice: {err}"}
        else:
            if ops:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {
        "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


def create_app(
    scheduler_name: str = SCHEDULER_NAME, dra: DraRewrite | None = None, mig: MigInventory | None = None
) -> fastapi.FastAPI:
    """The webhook's ASGI app: POST /mutate (AdmissionReview v1), GET /healthz."""
    # No schema of its own: its body is Kubernetes' AdmissionReview (admission.k8s.io/v1), checked by
    # pod_shape; a FastAPI schema here would list /mutate with no body at all.
    app = fastapi.FastAPI(title="gpuslice admission webhook", openapi_url=None, docs_url=None, redoc_url=None)

    @app.post("/mutate")
    async def mutate(request: fastapi.Request) -> JSONResponse:
        try:  # a review without a usable uid cannot be answered as one: a 400 with why
            review = strict_json(await request.body())
            check_review(review)
        except InvalidRequest as err:
            return JSONResponse({"error": f"gpuslice: {err}"}, status_code=400)
        # admit may list the cluster's nodes (a blocking call): off the event loop
        return JSONResponse(await asyncio.to_thread(admit, review, scheduler_name, dra, mig))

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app


def run(
    cert: str,
    key: str,
    host: str = "0.0.0.0",
    port: int = 8443,
    scheduler_name: str = SCHEDULER_NAME,
    dra: DraRewrite | None = None,
    mig: MigInventory | None = None,
) -> None:
    """Serve the webhook over HTTPS until interrupted (the API server only calls webhooks over TLS);
    a TLS handshake unfinished after ``TLS_HANDSHAKE_TIMEOUT_S`` drops its connection."""
    import uvicorn

    class BoundedHandshakes(uvicorn.Server):
        """uvicorn passes no handshake timeout to the event loop's ``create_server``: its listener is
        made here with one (the asyncio loop, whose methods can be wrapped; a webhook needs no uvloop)."""

        async def startup(self, sockets: Any = None) -> None:
            loop = asyncio.get_running_loop()
            create = loop.create_server

            async def bounded(*args: Any, **kwargs: Any) -> Any:
                kwargs["ssl_handshake_timeout"] = TLS_HANDSHAKE_TIMEOUT_S
                return await create(*args, **kwargs)

            loop.create_server = bounded  # type: ignore[method-assign]
            try:
                await super().startup(sockets)
            finally:
                del loop.create_server  # the class's method again

    config = uvicorn.Config(
        create_app(scheduler_name, dra, mig),
        host=host,
        port=port,
        ssl_certfile=cert,
        ssl_keyfile=key,
        log_level="info",
        loop="asyncio",
    )
    BoundedHandshakes(config).run()
