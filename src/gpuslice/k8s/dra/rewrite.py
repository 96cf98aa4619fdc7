"""The webhook's DRA rewrite: a pod that asks for ``gpuslice.io/*`` extended resources gets a
ResourceClaimTemplate instead, for users who do not write claims.

```text
gpu: 1, gpumem: 4096, gpucores: 30 -> template gpuslice-share-4096mi-30c (class gpu.gpuslice.io,
                                       capacity memory 4096Mi, cores 30)
gpu: 2                             -> template gpuslice-whole-2 (class whole-gpu.gpuslice.io, count 2)
mig-3g.40gb: 1                     -> template gpuslice-mig-3g-40gb (class mig.gpuslice.io,
                                       selector migProfile == "3g.40gb")
pod: the gpuslice.io resources removed from the container, spec.resourceClaims += {gpuslice-gpu:
     template}, the container's resources.claims += gpuslice-gpu, spec.schedulingGates += GATE
```

A pod where several containers ask: each asking app container gets its own claim (``gpuslice-gpu`` for
the first, ``gpuslice-gpu-1``, ``gpuslice-gpu-2``, ... for the others, each from the template of its own
shape), and the allocator places all of them on one node or none. An init container that asks runs
inside the first slice, as on the device plugin path: it references the first claim, so it runs with
that claim's GPUs and limits (the webhook has checked that its own ask fits inside them).

kube-controller-manager's resourceclaim controller makes each pod's claim from its template; the
allocator (``gpuslice k8s dra-allocator``) finds it through the pod's ``status.resourceClaimStatuses``,
decides node and GPUs, and lifts the gate; a MIG claim is ungated unallocated, for kube-scheduler to
allocate. Templates are named by their shape, so pods of one shape share one template; the webhook
creates a missing one in the pod's namespace (not on a dry run) and leaves existing ones as they are.

Which pods: ``gpuslice k8s webhook --dra-claims label`` rewrites pods labelled ``gpuslice.io/dra:
"true"``; ``--dra-claims all`` every gpuslice pod; ``off`` (the default) none, they keep the device
plugin path. A pod that names GPU models (``gpuslice.io/gpu-models``) is refused under DRA for now:
write a claim with a selector instead.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gpuslice.errors import InvalidRequest
from gpuslice.k8s.annotations import (
    ANNOTATION_EXCLUDE_GPU_MODELS,
    ANNOTATION_GPU_MODELS,
    DOMAIN,
    PodGpuRequest,
)
from gpuslice.k8s.dra.allocator import GATE
from gpuslice.k8s.dra.classes import CLASS_MIG, CLASS_SHARED, CLASS_WHOLE
from gpuslice.k8s.dra.slices import API_VERSION, DRIVER

__all__ = [
    "CLAIM_NAME",
    "LABEL_DRA",
    "DraClaims",
    "TemplateStore",
    "claim_name",
    "claim_template",
    "claim_templates",
    "rewrite_ops",
    "wants_rewrite",
]

LABEL_DRA = f"{DOMAIN}/dra"  # "true": this pod's gpuslice resources become a DRA claim
CLAIM_NAME = "gpuslice-gpu"  # the pod's claim entry and the container's claim reference
REQUEST_NAME = "gpu"


class DraClaims(enum.StrEnum):
    """Which pods the webhook rewrites into claims (``--dra-claims``)."""

    OFF = "off"
    LABEL = "label"
    ALL = "all"


class TemplateStore(Protocol):
    """Creates a ResourceClaimTemplate unless one of that name exists (``DraApi`` in production)."""

    def ensure_template(self, namespace: str, template: Mapping[str, Any]) -> None: ...


def wants_rewrite(pod: Mapping[str, Any], mode: DraClaims) -> bool:
    if mode is DraClaims.ALL:
        return True
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return mode is DraClaims.LABEL and str(labels.get(LABEL_DRA, "")).lower() == "true"


def _exactly(ask: PodGpuRequest) -> tuple[str, dict[str, Any]]:
    """The template's name and its request's ``exactly``."""
    if ask.mig_profile:
        profile = ask.mig_profile
        selector = f'device.attributes["{DRIVER}"].migProfile == "{profile}"'
        name = "gpuslice-mig-" + re.sub(r"[^a-z0-9]+", "-", profile.lower()).strip("-")
        return name, {
            "deviceClassName": CLASS_MIG,
            "count": 1,
            "selectors": [{"cel": {"expression": selector}}],
        }
    share = ask.gpus == 1 and (ask.memory_mib > 0 or 0 < ask.cores_percent < 100)
    if not share:
        return f"gpuslice-whole-{ask.gpus}", {"deviceClassName": CLASS_WHOLE, "count": ask.gpus}
    cores = ask.cores_percent if 0 < ask.cores_percent < 100 else (1 if ask.memory_mib else 100)
    requests: dict[str, str] = {"cores": str(cores)}
    if ask.memory_mib:
        requests["memory"] = f"{ask.memory_mib}Mi"
    memory = f"{ask.memory_mib}mi" if ask.memory_mib else "all"
    return f"gpuslice-share-{memory}-{cores}c", {
        "deviceClassName": CLASS_SHARED,
        "count": 1,
        "capacity": {"requests": requests},
    }


def claim_template(ask: PodGpuRequest, namespace: str) -> dict[str, Any]:
    """The ResourceClaimTemplate for ``ask`` (a pod's gpuslice request) in ``namespace``."""
    if ask.gpu_models or ask.excluded_gpu_models:
        raise InvalidRequest(
            f"annotations {ANNOTATION_GPU_MODELS}/{ANNOTATION_EXCLUDE_GPU_MODELS} are not carried into DRA "
            f"claims: drop the label {LABEL_DRA}, or write a ResourceClaim with a selector on productName"
        )
    name, exactly = _exactly(ask)
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpuslice-webhook"},
        },
        "spec": {"spec": {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}}},
    }


def claim_templates(ask: PodGpuRequest, namespace: str) -> list[dict[str, Any]]:
    """The templates of every asking app container's claim, in ``ask.containers`` order (containers of
    one shape share a template, so a name may repeat)."""
    return [claim_template(one, namespace) for one in ask.containers]


def claim_name(k: int) -> str:
    """The pod's claim entry of its k-th asking app container (0: the first)."""
    return CLAIM_NAME if k == 0 else f"{CLAIM_NAME}-{k}"


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def rewrite_ops(pod: Mapping[str, Any], ask: PodGpuRequest, templates: Sequence[str]) -> list[dict[str, Any]]:
    """JSONPatch operations: each asking container's gpuslice resources replaced by its claim, the k-th
    asking app container's from ``templates[k]`` (``claim_templates``), init containers on the first."""
    if len(templates) != len(ask.containers):
        raise ValueError(f"{len(ask.containers)} asking containers, {len(templates)} templates")
    claim_of = {one.container: claim_name(k) for k, one in enumerate(ask.containers)}
    claim_of.update({one.container: CLAIM_NAME for one in ask.init})
    spec = pod.get("spec") or {}
    ours = {claim_name(k) for k in range(len(templates))}
    taken = sorted(ours & {str(c.get("name")) for c in spec.get("resourceClaims") or []})
    if taken:
        raise InvalidRequest(f"the pod already has a resource claim named {taken[0]!r}; rename it")
    ops: list[dict[str, Any]] = []
    for group in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(group) or []):
            name = claim_of.get(container.get("name", ""))
            if name is None:
                continue
            path = f"/spec/{group}/{i}/resources"
            resources = container.get("resources") or {}
            for part in ("requests", "limits"):
                for key in sorted(resources.get(part) or {}):
                    if key.startswith(f"{DOMAIN}/"):
                        ops.append({"op": "remove", "path": f"{path}/{part}/{_escape(key)}"})
            entry = {"name": name}
            if resources.get("claims"):
                ops.append({"op": "add", "path": f"{path}/claims/-", "value": entry})
            else:
                ops.append({"op": "add", "path": f"{path}/claims", "value": [entry]})
    claims = [
        {"name": claim_name(k), "resourceClaimTemplateName": template} for k, template in enumerate(templates)
    ]
    if spec.get("resourceClaims"):
        ops += [{"op": "add", "path": "/spec/resourceClaims/-", "value": claim} for claim in claims]
    else:
        ops.append({"op": "add", "path": "/spec/resourceClaims", "value": claims})
    gate = {"name": GATE}
    if spec.get("schedulingGates"):
        ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": gate})
    else:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [gate]})
    return ops
