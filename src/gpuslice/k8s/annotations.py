"""Every resource name, annotation and label gpuslice uses on Kubernetes, and their (de)serialisation.

Nothing else spells a key: the extender, the webhook and the device plugin import these constants.

```text
who writes              what                                         who reads
user (pod spec)         resources gpuslice.io/gpu, /gpumem (MiB),    webhook (defaults, rejects),
                        /gpucores (percent), /mig-<profile>           extender (filter, bind)
user (pod annotations)  gpuslice.io/gpu-models, /exclude-gpu-models, extender
                        /placement-policy
device plugin (node)    gpuslice.io/node-inventory (JSON)            extender (builds its ledger)
extender at bind (pod)  gpuslice.io/node, /gpu-indices, /gpu-uuids,  device plugin Allocate,
                        /gpumem-mib, /gpucores, /mig-instance, ...   extender (ledger after restart)
```

Resource semantics (HAMi's, so its users find them familiar; hami_and_peers.md):

* ``gpuslice.io/gpu: N`` — N distinct GPUs on one node. The device plugin advertises each GPU as
  ``splitCount`` shares of this resource, so at most ``splitCount`` pods share one GPU.
* ``gpuslice.io/gpumem: M`` — M MiB of GPU memory on each of those GPUs (absent: the whole GPU's memory).
* ``gpuslice.io/gpucores: P`` — P percent of each GPU's compute, 1..100 (absent: 100 when no memory is
  given, i.e. a whole GPU; with memory alone, no compute is reserved beyond a token 1 milli-GPU, as
  ``JobSpec`` does for memory-only shares).
* ``gpuslice.io/mig-<profile>: 1`` — one existing MIG instance of that profile (``mig-1g.10gb``).

Each app container that asks gets its own slice, all on the pod's node (as HAMi does per container);
the decision annotations describe the first (named in ``gpuslice.io/container``), and with more than one
asking container ``gpuslice.io/container-slices`` lists them all. An init container runs before the app
containers and never beside them (Kubernetes' peak rule: a pod needs the larger of its init containers'
ask and its app containers' sum), so it asks for no room of its own: it runs inside the slice of the
pod's first GPU container, within its own limits, and may ask for at most that slice. (A pod where only
init containers ask: the first one's ask is the slice, the others run inside it.) Limits win over
requests where both are set (for extended resources Kubernetes requires them to be equal anyway).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuslice.errors import InvalidRequest
from gpuslice.k8s import quantity
from gpuslice.units import MiB
from gpuslice.workload.request import Request, share_milli

__all__ = [
    "ANNOTATION_ALLOCATED",
    "ANNOTATION_ALLOCATED_CONTAINERS",
    "ANNOTATION_BIND_PHASE",
    "ANNOTATION_BIND_TIME",
    "ANNOTATION_CONTAINER",
    "ANNOTATION_CONTAINER_SLICES",
    "ANNOTATION_EXCLUDE_GPU_MODELS",
    "ANNOTATION_GPUCORES",
    "ANNOTATION_GPUMEM_MIB",
    "ANNOTATION_GPU_INDICES",
    "ANNOTATION_GPU_MODELS",
    "ANNOTATION_GPU_UUIDS",
    "ANNOTATION_MIG_INSTANCE",
    "ANNOTATION_NODE",
    "ANNOTATION_NODE_INVENTORY",
    "ANNOTATION_PLACEMENT_POLICY",
    "BIND_PHASE_ALLOCATED",
    "BIND_PHASE_ALLOCATING",
    "BIND_PHASE_FAILED",
    "DECISION_ANNOTATIONS",
    "DEFAULT_SPLIT_COUNT",
    "DEFAULT_STATE_DIR",
    "DOMAIN",
    "INVENTORY_VERSION",
    "LABEL_GPU_NODE",
    "RESOURCE_GPU",
    "RESOURCE_GPUCORES",
    "RESOURCE_GPUMEM",
    "RESOURCE_MIG_PREFIX",
    "SCHEDULER_NAME",
    "InventoryGpu",
    "MigSlot",
    "NodeInventory",
    "PodGpuRequest",
    "asks_for_gpuslice",
    "managed_resources",
    "mig_profile",
    "mig_resource",
    "pod_gpu_request",
]

DOMAIN = "gpuslice.io"

# ---- resources (pod spec containers[].resources) ----------------------------------------------------
RESOURCE_GPU = f"{DOMAIN}/gpu"  # number of GPUs; each GPU is advertised as splitCount shares
RESOURCE_GPUMEM = f"{DOMAIN}/gpumem"  # MiB per GPU
RESOURCE_GPUCORES = f"{DOMAIN}/gpucores"  # percent of each GPU's compute, 1..100
RESOURCE_MIG_PREFIX = f"{DOMAIN}/mig-"  # + profile name: gpuslice.io/mig-1g.10gb

# ---- pod annotations the user may set -----------------------------------------------------------------
ANNOTATION_GPU_MODELS = f"{DOMAIN}/gpu-models"  # comma list: only these models ("A100-80GB,H100")
ANNOTATION_EXCLUDE_GPU_MODELS = f"{DOMAIN}/exclude-gpu-models"  # comma list: never these models
ANNOTATION_PLACEMENT_POLICY = f"{DOMAIN}/placement-policy"  # a name from policies.PLACEMENT

# ---- pod annotations the extender writes at bind (the decision) ---------------------------------------
ANNOTATION_NODE = f"{DOMAIN}/node"
ANNOTATION_CONTAINER = f"{DOMAIN}/container"  # the container the decision is for
ANNOTATION_GPU_INDICES = f"{DOMAIN}/gpu-indices"  # "0,3": NVML indices on the node
ANNOTATION_GPU_UUIDS = f"{DOMAIN}/gpu-uuids"  # "GPU-…,GPU-…", same order as the indices
ANNOTATION_GPUMEM_MIB = f"{DOMAIN}/gpumem-mib"  # per GPU; the device plugin enforces it
ANNOTATION_GPUCORES = f"{DOMAIN}/gpucores"  # percent per GPU
ANNOTATION_MIG_INSTANCE = f"{DOMAIN}/mig-instance"  # "<gpu index>:<profile>@<start>[:<MIG uuid>]"
ANNOTATION_BIND_PHASE = f"{DOMAIN}/bind-phase"  # allocating -> allocated | failed (device plugin)
ANNOTATION_BIND_TIME = f"{DOMAIN}/bind-time"  # unix seconds when the extender bound the pod
ANNOTATION_ALLOCATED = f"{DOMAIN}/allocated"  # written by the device plugin after Allocate: "true"
# A pod where more than one container asks (``PodGpuRequest.multi``): every asking container's slice, in
# the order the kubelet allocates them (init containers, then app containers, each in spec order), as
# JSON; the keys above describe the first app container. The device plugin counts the containers it
# has answered in ``allocated-containers`` and answers the next one's slice.
ANNOTATION_CONTAINER_SLICES = f"{DOMAIN}/container-slices"
ANNOTATION_ALLOCATED_CONTAINERS = f"{DOMAIN}/allocated-containers"

BIND_PHASE_ALLOCATING = "allocating"  # bound by the extender, not yet allocated by the kubelet
BIND_PHASE_ALLOCATED = "allocated"  # the device plugin answered Allocate from the decision
BIND_PHASE_FAILED = "failed"  # the device plugin could not honour the decision

DECISION_ANNOTATIONS = (
    ANNOTATION_NODE,
    ANNOTATION_CONTAINER,
    ANNOTATION_GPU_INDICES,
    ANNOTATION_GPU_UUIDS,
    ANNOTATION_GPUMEM_MIB,
    ANNOTATION_GPUCORES,
    ANNOTATION_MIG_INSTANCE,
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_CONTAINER_SLICES,
    ANNOTATION_ALLOCATED_CONTAINERS,
)

# ---- node annotation and label the device plugin writes -----------------------------------------------
ANNOTATION_NODE_INVENTORY = f"{DOMAIN}/node-inventory"  # JSON, see NodeInventory
LABEL_GPU_NODE = f"{DOMAIN}/gpu-node"  # "true": the operator marks GPU nodes; the DaemonSet selects them
INVENTORY_VERSION = 1

SCHEDULER_NAME = "gpuslice-scheduler"  # the kube-scheduler profile that calls the extender
# HAMi's default deviceSplitCount is 10 (hami_and_peers.md): ten pods may share one GPU.
DEFAULT_SPLIT_COUNT = 10
MAX_SPLIT_COUNT = 1_000  # shares of one GPU: past 1,000 a share is less than a milli-GPU
# Host directory of the soft-cap file and the shim library, mounted into every pod that gets a share.
DEFAULT_STATE_DIR = "/var/lib/gpuslice"


def mig_resource(profile: str) -> str:
    """``1g.10gb`` -> ``gpuslice.io/mig-1g.10gb``; ``1g.10gb+me`` -> ``gpuslice.io/mig-1g.10gb.me``
    ('+' is not allowed in a resource name, which must be a qualified name)."""
    return f"{RESOURCE_MIG_PREFIX}{profile.replace('+', '.')}"


def mig_profile(resource: str) -> str:
    """The MIG profile a ``gpuslice.io/mig-…`` resource names: the inverse of ``mig_resource``."""
    name = resource.removeprefix(RESOURCE_MIG_PREFIX)
    return name[: -len(".me")] + "+me" if name.endswith(".me") else name


def managed_resources(mig_profiles: Sequence[str] = ()) -> tuple[str, ...]:
    """The resource names the extender manages (KubeSchedulerConfiguration ``managedResources``)."""
    return (RESOURCE_GPU, RESOURCE_GPUMEM, RESOURCE_GPUCORES, *(mig_resource(p) for p in mig_profiles))


# ---- node inventory -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigSlot:
    """One existing MIG GPU instance on a GPU: its profile, start slice, and MIG device UUID if known."""

    profile: str
    start: int
    uuid: str = ""
    gi_id: int = -1

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "start": self.start, "uuid": self.uuid, "giId": self.gi_id}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MigSlot:
        return cls(
            str(data["profile"]), int(data["start"]), str(data.get("uuid", "")), int(data.get("giId", -1))
        )


@dataclass(frozen=True, slots=True)
class InventoryGpu:
    """One physical GPU as the device plugin saw it. ``mig`` is non-empty only when MIG mode is on."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True
    mig: tuple[MigSlot, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "memoryMiB": self.memory_mib,
            "healthy": self.healthy,
        }
        if self.mig:
            out["mig"] = [m.to_json() for m in self.mig]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InventoryGpu:
        return cls(
            index=int(data["index"]),
            uuid=str(data["uuid"]),
            model=str(data["model"]),
            memory_mib=int(data["memoryMiB"]),
            healthy=bool(data.get("healthy", True)),
            mig=tuple(MigSlot.from_json(m) for m in data.get("mig", ())),
        )


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """What the device plugin publishes in ``gpuslice.io/node-inventory`` on its node.

    ``topology`` is the ``nvidia-smi topo -m`` GPU x GPU label matrix ("X", "NV12", "PIX", "SYS" …, the
    input of ``hardware.topology.build_topology``), empty when unknown. ``split_count`` is how many shares
    of ``gpuslice.io/gpu`` each GPU is advertised as.
    """

    gpus: tuple[InventoryGpu, ...]
    topology: tuple[tuple[str, ...], ...] = ()
    split_count: int = DEFAULT_SPLIT_COUNT
    version: int = INVENTORY_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "splitCount": self.split_count,
                "gpus": [g.to_json() for g in self.gpus],
                "topology": [list(row) for row in self.topology],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> NodeInventory:
        """Parse the annotation; InvalidRequest names what is wrong (the extender skips such a node)."""
        try:
            data = json.loads(text)
            version = int(data.get("version", INVENTORY_VERSION))
            if version != INVENTORY_VERSION:
                raise InvalidRequest(f"inventory version {version}; this gpuslice reads {INVENTORY_VERSION}")
            gpus = tuple(InventoryGpu.from_json(g) for g in data.get("gpus", ()))
            topology = tuple(tuple(str(c) for c in row) for row in data.get("topology", ()))
            split = int(data.get("splitCount", DEFAULT_SPLIT_COUNT))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise InvalidRequest(f"malformed {ANNOTATION_NODE_INVENTORY} annotation: {err}") from None
        if split < 1:
            raise InvalidRequest(f"{ANNOTATION_NODE_INVENTORY}: splitCount must be at least 1, got {split}")
        if topology and (len(topology) != len(gpus) or any(len(r) != len(gpus) for r in topology)):
            raise InvalidRequest(f"{ANNOTATION_NODE_INVENTORY}: topology must be {len(gpus)}x{len(gpus)}")
        return cls(gpus=gpus, topology=topology, split_count=split, version=version)

    @property
    def model(self) -> str:
        """The node's GPU model (the ledger keeps one model per node: the first GPU's)."""
        return self.gpus[0].model if self.gpus else ""


# ---- what a pod asks for ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodGpuRequest:
    """The gpuslice part of one pod: read from its resources and annotations by ``pod_gpu_request``."""

    container: str = ""
    gpus: int = 0
    memory_mib: int = 0  # per GPU; 0 = the whole GPU's memory
    cores_percent: int = 0  # per GPU; 0 = not given
    mig_profile: str = ""
    mig_count: int = 0
    gpu_models: tuple[str, ...] = ()
    excluded_gpu_models: tuple[str, ...] = ()
    policy: str = ""  # "" = the extender's default
    # The pod's other app containers that ask, in spec order (each its own slice on the same node), and
    # its other init containers that ask (each runs inside this container's slice): see the module doc.
    more: tuple[PodGpuRequest, ...] = ()
    init: tuple[PodGpuRequest, ...] = ()
    is_init: bool = False  # this container is an init container (no app container of the pod asks)
    # The ledger request, built once when the ask is read: what filter, prioritize, bind and the
    # preemption what-if all judge and reserve (``to_request``).
    request: Request = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "request",
            Request(
                cpu_milli=0,
                num_gpu=self.gpus,
                gpu_milli=self.gpu_milli if self.gpus else 0,
                gpu_models=self.gpu_models,
                gpu_memory_bytes=self.memory_mib * MiB,
                excluded_gpu_models=self.excluded_gpu_models,
            ),
        )

    @property
    def wants_gpu(self) -> bool:
        return self.gpus > 0 or self.mig_count > 0

    @property
    def slice_cores_percent(self) -> int:
        """The compute percent a decision records for this ask: its cores, else 0 for a memory-only
        share and 100 for whole GPUs."""
        return self.cores_percent or (0 if self.memory_mib else 100)

    @property
    def multi(self) -> bool:
        """More than one container asks: the kubelet calls Allocate once per asking container."""
        return bool(self.more or self.init)

    @property
    def containers(self) -> tuple[PodGpuRequest, ...]:
        """The app containers' asks, this one first: each is one slice (one ledger request)."""
        return (self, *self.more)

    def fits_inside(self, outer: PodGpuRequest) -> bool:
        """Does this ask fit in ``outer``'s slice: the same MIG profile, or no more GPUs, compute and
        memory per GPU than it (``outer`` without memory holds each GPU's whole memory)?"""
        if self.mig_profile or outer.mig_profile:
            return self.mig_profile == outer.mig_profile
        return (
            self.gpus <= outer.gpus
            and self.request.gpu_milli <= outer.request.gpu_milli
            and (outer.memory_mib == 0 or 0 < self.memory_mib <= outer.memory_mib)
        )

    def text(self) -> str:
        """``4000 MiB, 30 % of 1 GPU`` / ``2 GPUs`` / ``MIG 1g.10gb``: what this container asks."""
        if self.mig_profile:
            return f"MIG {self.mig_profile}"
        if self.memory_mib or 0 < self.cores_percent < 100:
            parts = [f"{self.memory_mib} MiB"] if self.memory_mib else []
            parts += [f"{self.cores_percent} %"] if self.cores_percent else []
            return f"{', '.join(parts)} of {self.gpus} GPU"
        return f"{self.gpus} GPU" + ("s" if self.gpus != 1 else "")

    @property
    def gpu_milli(self) -> int:
        """Per-GPU compute in milli-GPU: cores x 10; a memory-only share takes 1; neither: a whole GPU."""
        return share_milli(self.cores_percent, self.memory_mib > 0)

    def to_request(self) -> Request:
        """The ledger request (CPU and memory are left to kube-scheduler's own NodeResourcesFit)."""
        return self.request


def _models(text: str | None) -> tuple[str, ...]:
    return tuple(sorted({m.strip() for m in (text or "").split(",") if m.strip()}))


def _container_resources(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    try:
        return {
            k: (quantity.mib_count if k == RESOURCE_GPUMEM else quantity.whole_count)(v, k)
            for k, v in merged.items()
            if k.startswith(f"{DOMAIN}/")
        }
    except InvalidRequest as err:
        raise InvalidRequest(f"container {container.get('name', '')!r}: {err}") from None


def asks_for_gpuslice(pod: Mapping[str, Any]) -> bool:
    """True when any container or init container names a gpuslice.io resource."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for part in ("requests", "limits"):
            if any(k.startswith(f"{DOMAIN}/") for k in resources.get(part) or {}):
                return True
    return False


def pod_gpu_request(pod: Mapping[str, Any]) -> PodGpuRequest:
    """Read a pod (API JSON, camelCase) into a PodGpuRequest; InvalidRequest says what is wrong.

    Rules, per container: gpumem/gpucores need gpu; cores 1..100; a share (cores < 100 or memory given) is
    for one GPU only; MIG is asked for alone, one instance. Per pod: the first app container that asks (with
    none, the first init container that asks) is the request, the other app containers ride in ``more``;
    the other init containers that ask ride in ``init`` and must fit inside the first one's slice
    (``PodGpuRequest.fits_inside``); a sidecar (an init container with
    ``restartPolicy: Always``, which runs beside the app containers) may not ask yet.
    """
    spec = pod.get("spec") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    models = _models(annotations.get(ANNOTATION_GPU_MODELS))
    excluded = _models(annotations.get(ANNOTATION_EXCLUDE_GPU_MODELS))
    policy = str(annotations.get(ANNOTATION_PLACEMENT_POLICY, "")).strip()

    def asks(containers: Any) -> list[tuple[Mapping[str, Any], PodGpuRequest]]:
        return [
            (c, _container_ask(str(c.get("name", "")), res, models, excluded, policy))
            for c in containers or []
            if (res := _container_resources(c))
        ]

    app, init = asks(spec.get("containers")), asks(spec.get("initContainers"))
    if not app and not init:
        return PodGpuRequest(gpu_models=models, excluded_gpu_models=excluded, policy=policy)
    for c, ask in init:
        if c.get("restartPolicy") == "Always":
            raise InvalidRequest(
                f"init container {ask.container!r} is a sidecar (restartPolicy: Always) and asks for "
                f"{DOMAIN} resources: a sidecar runs beside the app containers, which gpuslice does not "
                "place yet; ask in an app container"
            )
    # The first slice: the first app container's, or with none asking the first init container's.
    (_, first), inside = (app[0], init) if app else (init[0], init[1:])
    for _, ask in inside:
        if not ask.fits_inside(first):
            raise InvalidRequest(
                f"init container {ask.container!r} asks for {ask.text()}, more than container "
                f"{first.container!r}'s slice ({first.text()}): an init container runs inside the slice of "
                "the pod's first GPU container; ask for at most that slice"
            )
    if len(app) <= 1 and not inside:
        return first
    return replace(
        first, more=tuple(a for _, a in app[1:]), init=tuple(a for _, a in inside), is_init=not app
    )


def _container_ask(
    container: str, res: Mapping[str, int], models: tuple[str, ...], excluded: tuple[str, ...], policy: str
) -> PodGpuRequest:
    """One container's ask (its gpuslice.io resources ``res``); InvalidRequest names the container."""
    known = {RESOURCE_GPU, RESOURCE_GPUMEM, RESOURCE_GPUCORES}
    unknown = sorted(k for k in res if k not in known and not k.startswith(RESOURCE_MIG_PREFIX))
    if unknown:
        raise InvalidRequest(
            f"container {container!r}: unknown resource {unknown[0]}; known: {', '.join(sorted(known))}, "
            f"{RESOURCE_MIG_PREFIX}<profile>"
        )
    gpus, memory, cores = res.get(RESOURCE_GPU, 0), res.get(RESOURCE_GPUMEM, 0), res.get(RESOURCE_GPUCORES, 0)
    migs = {mig_profile(k): v for k, v in res.items() if k.startswith(RESOURCE_MIG_PREFIX)}
    migs = {k: v for k, v in migs.items() if v}
    where = f"container {container!r}"
    if migs:
        if gpus or memory or cores or len(migs) > 1 or sum(migs.values()) != 1:
            raise InvalidRequest(
                f"{where}: ask for exactly one MIG instance ({RESOURCE_MIG_PREFIX}<profile>: 1) and nothing "
                f"else; got {', '.join(f'{k}={v}' for k, v in sorted(res.items()))}"
            )
        ((profile, count),) = migs.items()
        return PodGpuRequest(container, 0, 0, 0, profile, count, models, excluded, policy)
    if (memory or cores) and not gpus:
        raise InvalidRequest(f"{where}: {RESOURCE_GPUMEM}/{RESOURCE_GPUCORES} need {RESOURCE_GPU} (e.g. 1)")
    if not 0 <= cores <= 100:
        raise InvalidRequest(f"{where}: {RESOURCE_GPUCORES} is a percent of one GPU, 1..100; got {cores}")
    if gpus > 1 and (memory or 0 < cores < 100):
        raise InvalidRequest(
            f"{where}: {gpus} GPUs with {RESOURCE_GPUMEM}/{RESOURCE_GPUCORES}: a share of a GPU is for one "
            f"GPU only; ask for {RESOURCE_GPU}: {gpus} alone (whole GPUs) or {RESOURCE_GPU}: 1 with a share"
        )
    try:
        out = PodGpuRequest(container, gpus, memory, cores, "", 0, models, excluded, policy)
        out.to_request()  # the ledger's own checks: GPU count per node, model both pinned and excluded
    except InvalidRequest as err:
        raise InvalidRequest(f"{where}: {err}") from None
    return out
