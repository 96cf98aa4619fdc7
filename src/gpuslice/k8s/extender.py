"""kube-scheduler extender: filter, prioritize and bind over a gpuslice Ledger of the cluster's GPUs.

Lifecycle of one pod (k8s_nvidia_reference.md §1; the extender is ``nodeCacheCapable``, so it gets
node names, never node objects):

```text
POST /filter      {Pod, NodeNames}  -> {NodeNames, FailedNodes{name: reason}, Error}
                  per node a verdict from the pod's shape's cache: rows whose Ledger.version moved are
                  recomputed, the rest reused; the survivors' ledger indices kept for /prioritize
                  0 nodes pass -> a Warning Event on the pod saying why (off the request path)
POST /prioritize  {Pod, NodeNames}  -> [{Host, Score 0..10}]      placement policy's scores, rescaled
                  (0 where filter's verdict refuses the node)
POST /preempt     {Pod, NodeNameToMetaVictims} -> the candidates where evicting those victims frees a GPU
                  the pod fits on (a what-if over one ledger row)
POST /bind        {PodName, PodNamespace, PodUID, Node}
                  per-node lock: choose GPUs (policy advice, topology), Ledger.reserve   (microseconds)
                  no lock:       patch decision annotations, create the Binding  -> {Error}
                  API failure -> the reservation is released; kube-scheduler retries the pod
watch             Node inventory annotation changed -> ledger rebuilt lazily on the next call (with new,
                  empty verdict caches)
                  Pod bound elsewhere / after a restart -> reserved from its decision annotations
                  Pod deleted, Succeeded or Failed -> released
```

Why no multi-minute stalls (HAMi's node lock, hami_and_peers.md): HAMi marks a node locked in an
annotation at bind and unlocks it only when its device plugin finishes Allocate, so a pod that never
reaches Allocate holds the node until a timeout. Here the in-memory ledger is the arbiter: a bind holds
its node's lock only while it chooses GPUs and reserves them, never across an API call, and a failed
bind gives its reservation back at once. A stale filter answer is harmless: bind re-checks against the
ledger and refuses with a reason if the node has filled up meanwhile.

Default placement policy: ``bestfit``. FGD (the better policy on openb) needs a target workload, the
mix of task shapes to come, which a freshly started extender does not have; bestfit needs nothing,
is deterministic and packs shares onto already-used GPUs, which is what keeps whole GPUs free. A pod
can ask for ``fgd`` (annotation ``gpuslice.io/placement-policy``); its target workload is then the
shapes of the pods bound when the ledger was last built, plus the pod itself.

The ledger keeps one GPU model per node (the first GPU's) and at most ``MAX_GPUS_PER_NODE`` GPUs;
MIG-mode and unhealthy GPUs are held by a blocker reservation so no share lands on them. MIG instances
are tracked beside the ledger, one pod per existing instance.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import fastapi
import numpy as np
from fastapi.responses import JSONResponse
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from gpuslice.errors import GpusliceError, InvalidRequest, UnknownPolicy
from gpuslice.hardware.node import MAX_GPUS_PER_NODE, NodeSpec
from gpuslice.hardware.topology import Topology, TopologyError, build_topology
from gpuslice.k8s import extender_wire as wire
from gpuslice.k8s import kube_client
from gpuslice.k8s.annotations import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_NODE_INVENTORY,
    ANNOTATION_PLACEMENT_POLICY,
    BIND_PHASE_FAILED,
    Decision,
    MigChoice,
    NodeInventory,
    PodGpuRequest,
    pod_gpu_request,
)
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode
from gpuslice.observe.k8s_metrics import instrument_extender
from gpuslice.policies import PolicyContext, placement_policy
from gpuslice.programs.loader import resolve
from gpuslice.scheduler.placer import Placer
from gpuslice.units import MiB
from gpuslice.workload.request import MILLI_PER_GPU, Request
from gpuslice.workload.target import TargetWorkload

__all__ = [
    "DEFAULT_POLICY",
    "MAX_EXTENDER_PRIORITY",
    "REASON_NO_INVENTORY",
    "REASON_NO_MIG_INSTANCE",
    "REASON_RESERVED",
    "REASON_SHARE_LIMIT",
    "RELISTED",
    "SERVER_OPTIONS",
    "ClusterState",
    "FilterResult",
    "KubeApi",
    "KubernetesApi",
    "WatchEvent",
    "create_app",
]

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = wire.MAX_EXTENDER_PRIORITY
DEFAULT_POLICY = "bestfit"  # see the module docstring for why not fgd
EVENT_REPEAT_S = 60.0  # one Event per pod and message a minute: kube-scheduler retries far more often
SEEN_PODS_MAX = 10_000  # pods remembered from /filter so /bind needs no API read
VERDICT_SHAPES_MAX = 256  # request shapes whose per-node verdicts are kept (45 kB each at 5,000 nodes)
NAME_LISTS_MAX = 4  # node-name lists remembered with their ledger indices (kube-scheduler repeats them)
# uvicorn.run options for the extender: the C HTTP parser (httptools) and event loop (uvloop) the k8s
# extra installs, cheaper per 100 kB body than the pure-Python h11 and asyncio; no access log line for
# the two calls kube-scheduler makes per pod (errors are still logged).
SERVER_OPTIONS: dict[str, Any] = {"http": "httptools", "loop": "uvloop", "access_log": False}

# Reasons the ledger has no RefusalCode for (fixed text, like RefusalCode values).
REASON_NO_INVENTORY = "no gpuslice inventory on this node (is the gpuslice device plugin running?)"
REASON_SHARE_LIMIT = "every fitting GPU already holds its maximum number of shares (splitCount)"
REASON_NO_MIG_INSTANCE = "no free MIG instance of this profile"
REASON_INVALID = "invalid gpuslice request"
RELISTED = "RELISTED"  # WatchEvent.type after a full list: object {"items": [...]}, everything that exists
# Verdict codes of one node for one pod (0 = fits); the first two are beyond preemption's reach
# (they go to FailedAndUnresolvableNodes).
_NO_INVENTORY, _MODEL, _SHARES, _GPU, _MEMORY, _NO_MIG = 1, 2, 3, 4, 5, 6
_RESERVED, _EXCLUDED = 7, 8  # held for a preempting pod; refused by the placement policy's own filter
REASON_RESERVED = "held for a higher-priority pod that preempted pods on this node"
# How long a node stays held for a pod that preempted there if it never binds (its victims' grace
# period, 30 s by default, plus kube-scheduler's retry back-off, with room to spare).
NOMINATION_S = 300.0
# A filter's hold on the chosen node's GPUs (``_assume``) without a bind for this long is given back:
# kube-scheduler binds within milliseconds of filtering, or retries the pod with a new filter.
ASSUMED_S = 30.0


# ---- the Kubernetes API, behind an interface ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch: ``kind`` Node or Pod, ``type`` ADDED/MODIFIED/DELETED, API JSON."""

    kind: str
    type: str
    object: Mapping[str, Any]


class KubeApi(Protocol):
    """What the extender needs from the API server. ``KubernetesApi`` is the real one; tests fake it."""

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]: ...

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None: ...

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None: ...

    def create_event(
        self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str
    ) -> None: ...

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete a preemption victim with its own grace period (only if it is still that pod: ``uid``)."""
        ...

    def pod_gone(self, namespace: str, name: str, uid: str) -> bool:
        """True once the pod ``uid`` no longer exists (deleted, or replaced by another of that name)."""
        ...


class KubernetesApi:
    """``KubeApi`` over the official ``kubernetes`` client (imported here, so the extra stays optional)."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        client = kube_client.kubernetes_client_module()
        self._client = client
        self._core = client.CoreV1Api(kube_client.api_client(kubeconfig))

    def _plain(self, obj: Any) -> dict[str, Any]:
        return self._core.api_client.sanitize_for_serialization(obj)

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self._plain(self._core.read_namespaced_pod(name, namespace))

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self._core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": dict(annotations)}})

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        c = self._client
        body = c.V1Binding(
            metadata=c.V1ObjectMeta(name=name, namespace=namespace, uid=uid),
            target=c.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        # _preload_content=False: the client cannot decode the Binding the server answers with
        # (kubernetes-client/python issue 547, "target must not be None").
        self._core.create_namespaced_binding(namespace, body, _preload_content=False)

    def create_event(self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str) -> None:
        c = self._client
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = c.CoreV1Event(
            metadata=c.V1ObjectMeta(generate_name=f"{pod_name}.", namespace=namespace),
            involved_object=c.V1ObjectReference(
                api_version="v1", kind="Pod", namespace=namespace, name=pod_name, uid=pod_uid
            ),
            reason=reason,
            message=message[:1024],
            type="Warning",
            source=c.V1EventSource(component="gpuslice-extender"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._core.create_namespaced_event(namespace, event)

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        c = self._client
        # The UID precondition: a pod recreated under the same name since is not touched.
        self._core.delete_namespaced_pod(
            name, namespace, body=c.V1DeleteOptions(preconditions=c.V1Preconditions(uid=uid))
        )

    def pod_gone(self, namespace: str, name: str, uid: str) -> bool:
        try:
            pod = self._core.read_namespaced_pod(name, namespace)
        except self._client.exceptions.ApiException as err:
            if err.status == 404:
                return True
            raise
        return bool(pod.metadata.uid != uid)

    def events(self) -> Iterator[WatchEvent]:
        """Every node and pod as ADDED, then their changes; relists after a dropped or expired watch."""
        from kubernetes import watch

        queue: list[WatchEvent] = []
        ready = threading.Condition()

        def pump(kind: str, lister: Callable[..., Any]) -> None:
            while True:
                try:
                    listed = lister()
                    objects = [self._plain(o) for o in listed.items]
                    with ready:
                        queue.extend(WatchEvent(kind, "ADDED", o) for o in objects)
                        # what was deleted while no watch ran shows up only as absence from the list
                        queue.append(WatchEvent(kind, RELISTED, {"items": objects}))
                        ready.notify()
                    stream = watch.Watch().stream(lister, resource_version=listed.metadata.resource_version)
                    for raw in stream:
                        with ready:
                            queue.append(WatchEvent(kind, raw["type"], self._plain(raw["object"])))
                            ready.notify()
                except Exception:  # 410 Gone, a dropped connection: relist, as informers do
                    log.warning("%s watch ended; relisting in 1 s", kind, exc_info=True)
                    time.sleep(1.0)

        for kind, lister in (("Node", self._core.list_node), ("Pod", self._core.list_pod_for_all_namespaces)):
            threading.Thread(target=pump, args=(kind, lister), daemon=True, name=f"watch-{kind}").start()
        while True:
            with ready:
                while not queue:
                    ready.wait()
                batch, queue[:] = list(queue), []
            yield from batch


# ---- cluster state ------------------------------------------------------------------------------------


@dataclass
class _Bound:
    """A pod the ledger holds: where it went and what it asked for."""

    node: str
    ask: PodGpuRequest
    decision: Decision
    placement: Placement | None = None  # None while its node has no inventory, or for MIG pods
    mig_key: tuple[str, int, int] | None = None  # (node, gpu, start)
    namespace: str = ""
    name: str = ""
    priority: int = 0  # spec.priority, set by the API server's Priority admission from priorityClassName


@dataclass(frozen=True, slots=True)
class _Nomination:
    """A node where a pod preempted others: held for it until it binds, goes away, or ``deadline``."""

    uid: str
    priority: int
    victims: frozenset[str]
    deadline: float  # time.monotonic()


@dataclass
class _Verdicts:
    """For one request shape: every node's verdict code and the ledger row version it was computed at.

    A node's verdict reads only its own ledger row (and its inventory, fixed for a build), and every
    change of a row bumps ``Ledger.version``: a bind, a release on a watch event, a reservation taken
    back. So a code is current exactly while its version matches; a new build starts a new cache.
    """

    codes: np.ndarray  # (N,) int8, _NO_INVENTORY.._NO_MIG (0 = fits)
    version: np.ndarray  # (N,) int64, -1 = not computed yet


@dataclass
class _Ledgered:
    """One build of the ledger: rebuilt when the set of nodes or an inventory changes."""

    ledger: Ledger
    index: dict[str, int]
    inventories: list[NodeInventory]
    split: np.ndarray  # (N,) shares per GPU
    healthy: np.ndarray  # (N, G) bool: present, healthy, not in MIG mode
    topologies: list[Topology | None]
    targets: TargetWorkload | None
    placers: dict[str, Placer] = field(default_factory=dict)
    blockers: list[Placement] = field(default_factory=list)
    verdicts: dict[Request, _Verdicts] = field(default_factory=dict)  # least recently used first


def _pod_meta(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace", "default")), str(meta.get("name", "")), str(meta.get("uid", ""))


def _gpu_count(inv: NodeInventory) -> int:
    return min(len(inv.gpus), MAX_GPUS_PER_NODE)


def _topology(name: str, inv: NodeInventory) -> Topology | None:
    n = _gpu_count(inv)
    if n < 2 or len(inv.topology) < n:
        return None
    try:
        return build_topology(name, [row[:n] for row in inv.topology[:n]], gpu_model=inv.model)
    except (TopologyError, ValueError):
        log.warning("node %s: unreadable topology in its inventory; GPUs chosen without it", name)
        return None


@dataclass(frozen=True, slots=True)
class FilterResult:
    """``passed`` node names; ``failed`` (preemption may help) and ``unresolvable`` map name -> reason."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


class ClusterState:
    """The ledger over every node with an inventory annotation, and the pods bound on them.

    Thread-safe: ``_lock`` guards every ledger change and the bookkeeping dicts (held for microseconds);
    ``_node_locks`` serialise binds on one node from choosing GPUs to reserving them.
    """

    def __init__(
        self,
        api: KubeApi,
        default_policy: str = DEFAULT_POLICY,
        *,
        narrow: bool = False,
        target: TargetWorkload | None = None,
    ) -> None:
        # A registry name, or (operator's choice only, never a pod's annotation) a verified, guarded
        # policy file; UnknownPolicy lists the known names, PolicyRejected the file's violations.
        self._default_factory = resolve(default_policy, "placement", placement_policy, on_event=log.warning)
        self.api = api
        self.default_policy = default_policy
        self._lock = threading.RLock()
        self._node_locks: dict[str, threading.Lock] = {}
        self._inventory_text: dict[str, str] = {}
        self._pods: dict[str, _Bound] = {}
        self._mig_used: dict[tuple[str, int, int], str] = {}
        self._built: _Ledgered | None = None
        self._seen: OrderedDict[str, Mapping[str, Any]] = OrderedDict()
        self._events = ThreadPoolExecutor(max_workers=1, thread_name_prefix="events")
        self._last_event: dict[str, tuple[str, float]] = {}
        # node-name lists as asked, with their ledger indices; the survivors of each pod's last filter
        self._name_cache: list[tuple[_Ledgered, list[str], np.ndarray]] = []
        self._passed: OrderedDict[str, tuple[_Ledgered, list[str], np.ndarray]] = OrderedDict()
        self.conflicts = 0  # bound pods the ledger could not hold (over-committed from outside)
        # Filter answers with the one node the placement policy chooses (see ``filter``); False leaves
        # the choice among all fitting nodes to kube-scheduler's scoring plus this extender's scores.
        self.narrow = narrow
        self._nominations: dict[str, _Nomination] = {}  # node name -> the pod that preempted there
        self._assumed: dict[str, float] = {}  # uid -> when filter held its GPUs (bind not seen yet)
        self.preemptions = 0  # pods this extender evicted to make room for higher-priority ones
        # FGD's expected workload, given by the operator (``--target-workload``, its GPU part: CPU is
        # kube-scheduler's business here); else the shapes of the pods bound when the ledger was built.
        self.target = target

    # ---- watch --------------------------------------------------------------------------------------

    def apply(self, event: WatchEvent) -> None:
        """Take one watch event into the state."""
        if event.type == RELISTED:
            self._forget_unlisted(event)
        elif event.kind == "Node":
            self._apply_node(event)
        elif event.kind == "Pod":
            self._apply_pod(event)

    def follow(self, events: Iterable[WatchEvent]) -> None:
        """Apply events until the source ends (the real source never does); errors are logged, not fatal."""
        for event in events:
            try:
                self.apply(event)
            except Exception:
                log.exception("could not apply %s %s", event.type, event.kind)

    def _apply_node(self, event: WatchEvent) -> None:
        meta = event.object.get("metadata") or {}
        name = str(meta.get("name", ""))
        text = (meta.get("annotations") or {}).get(ANNOTATION_NODE_INVENTORY)
        if text is not None and event.type != "DELETED":
            try:
                NodeInventory.from_json(text)
            except InvalidRequest as err:
                log.warning("node %s: %s; the node is left out", name, err)
                text = None
        with self._lock:
            old = self._inventory_text.get(name)
            if event.type == "DELETED" or text is None:
                if old is not None:
                    del self._inventory_text[name]
                    self._built = None
            elif text != old:  # status heartbeats leave the annotation alone: no rebuild for them
                self._inventory_text[name] = text
                self._built = None

    def _apply_pod(self, event: WatchEvent) -> None:
        pod = event.object
        _, _, uid = _pod_meta(pod)
        phase = (pod.get("status") or {}).get("phase")
        with self._lock:
            if event.type == "DELETED" or phase in ("Succeeded", "Failed"):
                self._forget(uid)
                self._drop_nomination(uid)
                return
            if uid in self._pods:
                return
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            try:
                decision = Decision.from_annotations(annotations)
                if decision is None or decision.phase == BIND_PHASE_FAILED:
                    return
                ask = _ask(pod)
            except InvalidRequest as err:
                log.warning("pod %s: %s; not counted in the ledger", uid, err)
                return
            namespace, name, _ = _pod_meta(pod)
            bound = _Bound(
                decision.node, ask, decision, namespace=namespace, name=name, priority=_priority(pod)
            )
            self._pods[uid] = bound
            if self._built is not None:
                self._hold(self._built, uid, bound)

    def _forget_unlisted(self, event: WatchEvent) -> None:
        """After a full list: drop the nodes or pods it no longer has (deleted while no watch ran)."""
        items = event.object.get("items") or []
        with self._lock:
            if event.kind == "Node":
                listed = {str((o.get("metadata") or {}).get("name", "")) for o in items}
                for name in [n for n in self._inventory_text if n not in listed]:
                    del self._inventory_text[name]
                    self._built = None
            elif event.kind == "Pod":
                listed = {_pod_meta(o)[2] for o in items}
                for uid in [u for u in self._pods if u not in listed]:
                    self._forget(uid)

    def _forget(self, uid: str) -> None:
        self._assumed.pop(uid, None)
        bound = self._pods.pop(uid, None)
        self._seen.pop(uid, None)
        self._last_event.pop(uid, None)
        if bound is None:
            return
        if bound.placement is not None and self._built is not None:
            self._built.ledger.release(bound.placement)
        if bound.mig_key is not None:
            self._mig_used.pop(bound.mig_key, None)

    # ---- ledger build -------------------------------------------------------------------------------

    def _ledgered(self) -> _Ledgered:
        """The current ledger, rebuilt (under the lock) if nodes or inventories changed."""
        built = self._built
        if built is not None:
            return built
        with self._lock:
            if self._built is None:
                self._built = self._build()
            return self._built

    def _build(self) -> _Ledgered:
        names = sorted(self._inventory_text)
        inventories = [NodeInventory.from_json(self._inventory_text[n]) for n in names]
        specs = [
            NodeSpec(
                name=name,
                cpu_milli=0,  # CPU and memory are kube-scheduler's NodeResourcesFit's job
                memory_bytes=0,
                gpu_count=_gpu_count(inv),
                gpu_model=inv.model,
                gpu_memory_bytes=min((g.memory_mib for g in inv.gpus), default=0) * MiB,
            )
            for name, inv in zip(names, inventories, strict=True)
        ] or [NodeSpec("(no gpuslice nodes)", 0, 0, 0, "")]
        ledger = Ledger(specs)
        healthy = np.zeros((ledger.node_count, MAX_GPUS_PER_NODE), dtype=bool)
        blockers = []
        for i, inv in enumerate(inventories):
            for gpu in inv.gpus:
                if gpu.index >= specs[i].gpu_count:
                    continue  # past the ledger's MAX_GPUS_PER_NODE, or a hole in the numbering
                if gpu.healthy and not gpu.mig:
                    healthy[i, gpu.index] = True
                    continue
                # A MIG-mode or unhealthy GPU is held whole, so no share and no score counts it as free.
                whole = Request(
                    0, num_gpu=1, gpu_milli=MILLI_PER_GPU, gpu_memory_bytes=specs[i].gpu_memory_bytes
                )
                held = ledger.reserve(i, (gpu.index,), whole)
                if isinstance(held, Placement):
                    blockers.append(held)
        shapes = [b.ask.to_request() for b in self._pods.values() if b.ask.gpus]
        built = _Ledgered(
            ledger=ledger,
            index={n: i for i, n in enumerate(names)},
            inventories=inventories,
            split=np.array([inv.split_count for inv in inventories] or [1], dtype=np.int64),
            healthy=healthy,
            topologies=[_topology(n, inv) for n, inv in zip(names, inventories, strict=True)],
            targets=TargetWorkload.from_requests(shapes) if shapes else None,
            blockers=blockers,
        )
        self._mig_used.clear()
        for uid, bound in self._pods.items():
            bound.placement, bound.mig_key = None, None
            self._hold(built, uid, bound)
        log.info("ledger built: %d nodes, %d pods", len(names), len(self._pods))
        return built

    def _hold(self, built: _Ledgered, uid: str, bound: _Bound) -> None:
        """Put an already bound pod into the ledger (or the MIG table) from its decision."""
        node = built.index.get(bound.node)
        if node is None:
            return  # its node has no inventory (yet): held when the node appears
        if bound.decision.mig is not None:
            key = (bound.node, bound.decision.mig.gpu_index, bound.decision.mig.start)
            if self._mig_used.setdefault(key, uid) != uid:
                self.conflicts += 1
            else:
                bound.mig_key = key
            return
        result = built.ledger.reserve(node, bound.decision.gpu_indices, bound.ask.to_request())
        if isinstance(result, Refusal):
            self.conflicts += 1
            log.warning(
                "pod %s on %s does not fit the ledger (%s); counted as a conflict", uid, bound.node, result
            )
        else:
            bound.placement = result

    # ---- filter -------------------------------------------------------------------------------------

    def filter(self, pod: Mapping[str, Any], node_names: list[str]) -> FilterResult:
        """Which of ``node_names`` can take the pod, with a reason for each one that cannot.

        With ``narrow`` (``gpuslice k8s extender``'s default, ``--decide``) exactly one node passes
        when any fits: the one the placement policy chooses among them, through the same ``Placer`` as
        ``gpuslice sim`` (its scores and tie rule). kube-scheduler then has nothing left to weigh, so
        its own scoring (which spreads pods, the opposite of packing) cannot undo the policy's choice;
        the other fitting nodes are reported failed with the node chosen instead.

        Reasons preemption cannot cure (no inventory, GPU model, invalid request) go to ``unresolvable``
        (``FailedAndUnresolvableNodes``), so kube-scheduler does not evict pods for nothing. If no node
        passes, this extender preempts lower-priority gpuslice pods itself where that makes room
        (``_preempt``: kube-scheduler's own preemption never reaches an extender that alone refuses a
        node), and a Warning Event on the pod says why it waits.
        """
        self._remember(pod)
        try:
            ask = _ask(pod)
        except InvalidRequest as err:
            reason = f"{REASON_INVALID}: {err}"
            self._explain(pod, len(node_names), Counter({reason: len(node_names)}))
            return FilterResult([], {}, dict.fromkeys(node_names, reason))
        if not ask.wants_gpu:
            return FilterResult(list(node_names), {}, {})
        uid = _pod_meta(pod)[2]
        if uid in self._assumed:  # filtered again without a bind: its own hold must not count against it
            with self._lock:
                self._forget(uid)
            self._remember(pod)
        self._catch_up_on_victims(uid)
        built = self._ledgered()
        idx = self._indices(built, node_names)
        codes, texts = self._verdicts(built, ask, idx)
        codes = self._reserved_for_others(pod, node_names, codes)
        texts = [*texts, *[""] * (_RESERVED - len(texts)), REASON_RESERVED]
        ok = codes == 0
        chosen = -1
        if self.narrow and ok.any():
            chosen = self._choose(built, ask, idx, ok)
            if chosen < 0:  # the policy's own filter took every fitting node away
                codes = np.where(ok, _EXCLUDED, codes)
                ok[:] = False
        texts = [*texts, *[""] * (_EXCLUDED - len(texts)), RefusalCode.EXCLUDED_BY_POLICY.value]
        names = np.fromiter(node_names, dtype=object, count=len(node_names))
        reason = np.array(texts, dtype=object)
        unresolvable = (codes == _NO_INVENTORY) | (codes == _MODEL)
        failed = ~ok & ~unresolvable
        failed_map = dict(zip(names[failed].tolist(), reason[codes[failed]].tolist(), strict=True))
        passed = names[ok].tolist()
        if chosen >= 0:
            others = ok.copy()
            others[chosen] = False
            policy = ask.policy or self.default_policy
            why = f"gpuslice ({policy}) chose {names[chosen]}"
            failed_map.update(dict.fromkeys(names[others].tolist(), why))
            passed = [names[chosen]]
            ok = np.zeros_like(ok)
            ok[chosen] = True
        result = FilterResult(
            passed,
            failed_map,
            dict(zip(names[unresolvable].tolist(), reason[codes[unresolvable]].tolist(), strict=True)),
        )
        self._keep_passed(pod, built, result.passed, idx[ok])
        if chosen >= 0:
            self._assume(pod, ask, node_names[chosen])
        if not ok.any() and node_names:
            counts = np.bincount(codes, minlength=len(texts))
            why = Counter({texts[c]: int(n) for c, n in enumerate(counts) if n})
            preempting = self._preempt(pod, built, ask, node_names, idx, codes)
            if preempting:
                why = Counter({preempting: len(node_names)})
            self._explain(pod, len(node_names), why)
        return result

    def _choose(self, built: _Ledgered, ask: PodGpuRequest, idx: np.ndarray, ok: np.ndarray) -> int:
        """Position in ``idx`` of the node the policy chooses among the ``ok`` ones; -1 if its filter
        refuses them all. MIG: the node with the fewest free instances of the profile (packing)."""
        rows = idx[ok]
        positions = np.flatnonzero(ok)
        if ask.mig_profile:
            free = [self._mig_free(built, int(i), ask.mig_profile) for i in rows]
            return int(positions[int(np.argmin(free))])
        placer = self._placer(built, ask)
        req = ask.to_request()
        mask = np.zeros(built.ledger.node_count, dtype=bool)
        mask[rows] = True
        mask &= placer.feasible(req)
        if not mask.any():
            return -1
        node = placer.choose_node(req, mask)
        return int(positions[np.flatnonzero(rows == node)[0]])

    def _assume(self, pod: Mapping[str, Any], ask: PodGpuRequest, node: str) -> None:
        """Hold the chosen node's GPUs for the pod from filter on, as kube-scheduler assumes a pod on its
        node before binding it asynchronously: the next pod's filter, which runs before this pod's
        bind arrives, must see this one placed (else consecutive pods are placed against the same
        state, and a policy's packing falls apart). Bind turns the hold into the decision; a hold whose
        bind never comes is given back after ``ASSUMED_S``."""
        uid = _pod_meta(pod)[2]
        if not uid:
            return
        now = time.monotonic()
        with self._lock:
            for other in [u for u, t in self._assumed.items() if now - t > ASSUMED_S]:
                del self._assumed[other]
                self._forget(other)
        with self._node_lock(node):
            decision, _problem = self._reserve(uid, node, ask, pod)
        if decision is not None:
            with self._lock:
                self._assumed[uid] = now

    # ---- preemption by the extender ---------------------------------------------------------------------

    def _reserved_for_others(
        self, pod: Mapping[str, Any], node_names: list[str], codes: np.ndarray
    ) -> np.ndarray:
        """Codes with ``_RESERVED`` on the nodes where a pod of at least this pod's priority preempted
        others and has not bound yet: the room it made is its own (kube-scheduler's nominated node)."""
        if not self._nominations:
            return codes
        uid, priority, now = _pod_meta(pod)[2], _priority(pod), time.monotonic()
        with self._lock:
            for node, held in list(self._nominations.items()):
                if held.deadline < now:
                    del self._nominations[node]
            held_nodes = {n for n, h in self._nominations.items() if h.uid != uid and h.priority >= priority}
        if not held_nodes:
            return codes
        mask = np.fromiter((n in held_nodes for n in node_names), dtype=bool, count=len(node_names))
        return np.where(mask & (codes == 0), _RESERVED, codes)

    def _catch_up_on_victims(self, uid: str) -> None:
        """For a pod that preempted others: forget the victims the API server no longer has.

        kube-scheduler retries the pod as soon as its informer sees a victim deleted, which can be
        before this extender's own watch delivers the same event; refused then, the pod would wait for
        kube-scheduler's next periodic retry (minutes). One read per remaining victim, only while such
        a pod waits."""
        held = next((h for h in self._nominations.values() if h.uid == uid), None)
        if held is None:
            return
        for victim in held.victims:
            bound = self._pods.get(victim)
            if bound is None:
                continue
            try:
                gone = self.api.pod_gone(bound.namespace, bound.name, victim)
            except Exception:
                log.warning("could not check victim %s/%s", bound.namespace, bound.name, exc_info=True)
                continue
            if gone:
                with self._lock:
                    self._forget(victim)

    def _drop_nomination(self, uid: str) -> None:
        for node in [n for n, h in self._nominations.items() if h.uid == uid]:
            del self._nominations[node]

    def _preempt(
        self,
        pod: Mapping[str, Any],
        built: _Ledgered,
        ask: PodGpuRequest,
        node_names: list[str],
        idx: np.ndarray,
        codes: np.ndarray,
    ) -> str:
        """Make room for a pod no node can take by evicting lower-priority gpuslice pods; '' if none.

        kube-scheduler's default preemption simulates evictions with its in-tree filters only: when just
        this extender refuses a node, the simulation finds no victim and never calls the extender's
        preempt verb (Kubernetes up to at least v1.37). So the extender does what that plugin would: on
        the nodes kube-scheduler offered, the fewest lowest-priority victims whose removal makes the pod
        fit (kube-scheduler's rules: only lower priority; prefer the node whose most important victim is
        least important, then fewer victims), deleted with their own grace period; the node is then held
        for the pod until it binds (``_reserved_for_others``). Returns the reason the pod waits.
        """
        namespace, name, uid = _pod_meta(pod)
        priority = _priority(pod)
        with self._lock:
            waiting = next((n for n, h in self._nominations.items() if h.uid == uid), None)
            if waiting is not None:
                left = sum(1 for v in self._nominations[waiting].victims if v in self._pods)
                return f"preempted lower-priority pods on {waiting}; waiting for {left} of them to end"
            by_node: dict[str, list[tuple[str, _Bound]]] = {}
            for other, bound in self._pods.items():
                if bound.priority < priority:
                    by_node.setdefault(bound.node, []).append((other, bound))
            best: tuple[tuple[int, int], str, list[tuple[str, _Bound]]] | None = None
            for k, node_name in enumerate(node_names):
                row, lower = int(idx[k]), by_node.get(node_name)
                if row < 0 or not lower or codes[k] in (_NO_INVENTORY, _MODEL, _RESERVED):
                    continue
                victims = self._victims(built, row, ask, lower)
                if victims:
                    key = (max(b.priority for _, b in victims), len(victims))
                    if best is None or key < best[0]:
                        best = (key, node_name, victims)
            if best is None:
                return ""
            _, node_name, victims = best
            self._nominations[node_name] = _Nomination(
                uid, priority, frozenset(u for u, _ in victims), time.monotonic() + NOMINATION_S
            )
            self.preemptions += len(victims)
        for victim_uid, bound in victims:
            try:
                self.api.delete_pod(bound.namespace, bound.name, victim_uid)
            except Exception:
                log.warning(
                    "could not delete preemption victim %s/%s", bound.namespace, bound.name, exc_info=True
                )
            self._post_event(
                bound.namespace,
                bound.name,
                victim_uid,
                "Preempted",
                f"gpuslice: preempted by {namespace}/{name} (priority {priority}) on {node_name}",
            )
        log.info("pod %s/%s preempted %d pod(s) on %s", namespace, name, len(victims), node_name)
        return f"preempted {len(victims)} lower-priority pod(s) on {node_name}; waiting for them to end"

    def _victims(
        self, built: _Ledgered, row: int, ask: PodGpuRequest, lower: list[tuple[str, _Bound]]
    ) -> list[tuple[str, _Bound]]:
        """The fewest pods of ``lower`` whose removal lets ``ask`` fit on ledger ``row`` ([] if none do):
        all of them must suffice, then each is spared, most important first, while the pod still fits."""
        if not self._fits_without(built, row, ask, [u for u, _ in lower]):
            return []
        victims = sorted(lower, key=lambda v: (-v[1].priority, -v[1].decision.bind_time))
        for spared in list(victims):
            rest = [v for v in victims if v is not spared]
            if self._fits_without(built, row, ask, [u for u, _ in rest]):
                victims = rest
        return victims

    def _indices(self, built: _Ledgered, node_names: list[str]) -> np.ndarray:
        """Ledger index per name (-1: no inventory). kube-scheduler sends the same list pod after pod,
        so the last few lists are kept and compared (a C-level list compare) instead of looked up again."""
        for cached_built, names, idx in self._name_cache:
            if cached_built is built and len(names) == len(node_names) and names == node_names:
                return idx
        count = len(node_names)
        idx = np.fromiter(map(built.index.get, node_names, itertools.repeat(-1, count)), np.int64, count)
        self._name_cache = [(built, list(node_names), idx), *self._name_cache[: NAME_LISTS_MAX - 1]]
        return idx

    def _keep_passed(
        self, pod: Mapping[str, Any], built: _Ledgered, passed: list[str], idx: np.ndarray
    ) -> None:
        """The pod's /prioritize comes next with the nodes that passed: keep their indices for it."""
        _, _, uid = _pod_meta(pod)
        with self._lock:
            self._passed[uid] = (built, passed, idx)
            self._passed.move_to_end(uid)
            while len(self._passed) > NAME_LISTS_MAX:
                self._passed.popitem(last=False)

    def _prioritize_indices(
        self, pod: Mapping[str, Any], built: _Ledgered, node_names: list[str]
    ) -> np.ndarray:
        """``_indices`` for /prioritize: usually exactly the nodes this pod's filter just passed."""
        kept = self._passed.get(_pod_meta(pod)[2])
        if kept is not None and kept[0] is built and (kept[1] is node_names or kept[1] == node_names):
            return kept[2]
        return self._indices(built, node_names)

    def _verdicts(
        self, built: _Ledgered, ask: PodGpuRequest, idx: np.ndarray
    ) -> tuple[np.ndarray, list[str]]:
        """Per node a code, 0 = fits, else an index into the returned reason texts (vectorised)."""
        known = idx >= 0
        safe = np.where(known, idx, 0)
        if ask.mig_profile:
            free = np.array(
                [
                    self._mig_free(built, int(i), ask.mig_profile) if k else 0
                    for i, k in zip(safe.tolist(), known.tolist(), strict=True)
                ]
            )
            codes = np.select([~known, free == 0], [_NO_INVENTORY, _NO_MIG], default=0)
            return codes, ["", REASON_NO_INVENTORY, "", "", "", "", REASON_NO_MIG_INSTANCE]
        req = ask.to_request()
        codes = np.where(known, self._shape_codes(built, req, safe), _NO_INVENTORY)
        n = req.num_gpu
        need = f"need {n} GPU(s) with {req.gpu_milli} milli-GPU" + (
            f" and {ask.memory_mib} MiB free" if ask.memory_mib else ""
        )
        texts = [
            "",
            REASON_NO_INVENTORY,
            f"{RefusalCode.GPU_MODEL_NOT_ALLOWED.value}: {_models_text(ask, built.ledger.models)}",
            f"{REASON_SHARE_LIMIT}; {need}",
            f"{RefusalCode.INSUFFICIENT_GPU.value}: {need}",
            f"{RefusalCode.INSUFFICIENT_GPU_MEMORY.value}: {need}",
        ]
        return codes, texts

    def _shape_codes(self, built: _Ledgered, req: Request, nodes: np.ndarray) -> np.ndarray:
        """Verdict codes of ``nodes`` (ledger indices) for ``req``, from the shape's cache: only the rows
        that changed since it was last asked are computed again (at 5,000 nodes one bind changes one)."""
        with self._lock:  # binds change rows under it; the version is read with the rows it describes
            cache = built.verdicts.pop(req, None)
            if cache is None:
                count = built.ledger.node_count
                cache = _Verdicts(np.zeros(count, dtype=np.int8), np.full(count, -1, dtype=np.int64))
            built.verdicts[req] = cache  # now the most recently used
            while len(built.verdicts) > VERDICT_SHAPES_MAX:
                del built.verdicts[next(iter(built.verdicts))]
            version = built.ledger.view.version
            stale = np.flatnonzero(cache.version != version)
            if len(stale):
                cache.codes[stale] = self._row_codes(built, req, stale)
                cache.version[stale] = version[stale]
            return cache.codes[nodes]

    @staticmethod
    def _row_codes(built: _Ledgered, req: Request, rows: np.ndarray) -> np.ndarray:
        """Verdict codes of ledger ``rows`` computed from the ledger (vectorised, the first failing check)."""
        ledger = built.ledger
        view = ledger.view
        slots = built.healthy[rows] & (view.gpu_tasks[rows] < built.split[rows][:, None])
        compute = view.free_gpu_milli[rows] >= req.gpu_milli
        memory = view.free_gpu_memory_bytes[rows] >= req.gpu_memory_bytes
        n = req.num_gpu
        return np.select(
            [
                ~ledger.model_allowed(req)[rows],
                slots.sum(axis=1) < n,
                (slots & compute).sum(axis=1) < n,
                (slots & compute & memory).sum(axis=1) < n,
            ],
            [_MODEL, _SHARES, _GPU, _MEMORY],
            default=0,
        )

    def _mig_free(self, built: _Ledgered, node: int, profile: str) -> int:
        name = built.ledger.node_names[node]
        return sum(
            1
            for gpu in built.inventories[node].gpus
            for slot in gpu.mig
            if slot.profile == profile and gpu.healthy and (name, gpu.index, slot.start) not in self._mig_used
        )

    # ---- prioritize ---------------------------------------------------------------------------------

    def prioritize(self, pod: Mapping[str, Any], node_names: list[str]) -> list[tuple[str, int]]:
        """(name, score 0..10) per node: the placement policy's score, min-max rescaled over the nodes."""
        return list(zip(node_names, self.scores(pod, node_names).tolist(), strict=True))

    def scores(self, pod: Mapping[str, Any], node_names: list[str]) -> np.ndarray:
        """``prioritize`` as an int array in the order of ``node_names``."""
        try:
            ask = _ask(pod)
        except InvalidRequest:
            return np.zeros(len(node_names), dtype=np.int64)
        if not ask.wants_gpu or not node_names:
            return np.zeros(len(node_names), dtype=np.int64)
        built = self._ledgered()
        idx = self._prioritize_indices(pod, built, node_names)
        known = idx >= 0
        if ask.mig_profile:  # pack: the node with the fewest free instances of the profile first
            free = np.array(
                [
                    self._mig_free(built, int(i), ask.mig_profile) if k else 0
                    for i, k in zip(idx, known, strict=True)
                ]
            )
            raw = np.where(free > 0, -free.astype(np.float64), -np.inf)
        else:
            placer = self._placer(built, ask)
            req = ask.to_request()
            raw = np.full(len(idx), -np.inf)
            fits = known & (self._shape_codes(built, req, np.where(known, idx, 0)) == 0)  # filter's verdicts
            if fits.any():
                candidates = idx[fits]
                # The placer's cached, fallback-guarded scoring (policy advises, the placer validates).
                raw[fits] = placer._normalized(req, placer._scores(req, candidates))
        return _rescale(raw)

    def _placer(self, built: _Ledgered, ask: PodGpuRequest) -> Placer:
        name = ask.policy or self.default_policy
        placer = built.placers.get(name)
        if placer is None:
            with self._lock:
                placer = built.placers.get(name)
                if placer is None:
                    factory = self._default_factory if name == self.default_policy else placement_policy(name)
                    target = self.target or built.targets or TargetWorkload.from_requests([ask.to_request()])
                    context = PolicyContext(rng=np.random.default_rng(0), target=target)
                    placer = built.placers[name] = Placer(built.ledger, factory(built.ledger.view, context))
        return placer

    # ---- bind ---------------------------------------------------------------------------------------

    def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Choose GPUs on ``node``, write the decision, create the Binding; '' or the error text."""
        pod = self._seen.get(uid)
        try:
            if pod is None:
                pod = self.api.get_pod(namespace, name)
            ask = _ask(pod)
        except InvalidRequest as err:
            return f"{REASON_INVALID}: {err}"
        except Exception as err:
            return f"cannot read pod {namespace}/{name}: {err}"
        decision: Decision | None = None
        if ask.wants_gpu:
            held = self._nominations.get(node)
            if held is not None and held.uid != uid and held.priority >= _priority(pod):
                return f"pod {namespace}/{name} on {node}: {REASON_RESERVED}"
            with self._lock:  # held since filter on this node: that hold is the decision (no re-pick,
                # whose release-then-reserve would let another pod's filter take the GPUs in between)
                assumed = self._pods.get(uid) if self._assumed.pop(uid, None) is not None else None
                if assumed is not None and assumed.node == node:
                    decision = assumed.decision
            if decision is None:
                with self._node_lock(node):
                    decision, problem = self._reserve(uid, node, ask, pod)
                if decision is None:
                    return f"pod {namespace}/{name} on {node}: {problem}"
            with self._lock:
                self._drop_nomination(uid)
        try:
            if decision is not None:
                self.api.patch_pod_annotations(namespace, name, decision.to_annotations())
            self.api.create_binding(namespace, name, uid, node)
        except Exception as err:
            with self._lock:
                self._forget(uid)
            if decision is not None:
                try:
                    self.api.patch_pod_annotations(
                        namespace, name, {ANNOTATION_BIND_PHASE: BIND_PHASE_FAILED}
                    )
                except Exception:
                    log.warning("could not mark %s/%s bind-phase failed", namespace, name, exc_info=True)
            return f"binding {namespace}/{name} to {node} failed: {err}"
        return ""

    def _node_lock(self, node: str) -> threading.Lock:
        with self._lock:
            return self._node_locks.setdefault(node, threading.Lock())

    def _reserve(
        self, uid: str, node_name: str, ask: PodGpuRequest, pod: Mapping[str, Any]
    ) -> tuple[Decision | None, str]:
        """Under the node's lock: pick GPUs and hold them in the ledger (or a MIG instance)."""
        with self._lock:
            if uid in self._pods:  # a retried bind: give back what the earlier attempt held
                self._forget(uid)
        built = self._ledgered()
        node = built.index.get(node_name)
        if node is None:
            return None, REASON_NO_INVENTORY
        inv = built.inventories[node]
        uuids = {g.index: g.uuid for g in inv.gpus}
        now = int(time.time())
        namespace, name, _ = _pod_meta(pod)
        who = {"namespace": namespace, "name": name, "priority": _priority(pod)}
        if ask.mig_profile:
            with self._lock:
                for gpu in inv.gpus:
                    for slot in gpu.mig:
                        key = (node_name, gpu.index, slot.start)
                        if slot.profile != ask.mig_profile or not gpu.healthy or key in self._mig_used:
                            continue
                        mig = MigChoice(gpu.index, slot.profile, slot.start, slot.uuid)
                        decision = Decision(
                            node_name, ask.container, (gpu.index,), (gpu.uuid,), 0, 100, mig, bind_time=now
                        )
                        self._mig_used[key] = uid
                        self._pods[uid] = _Bound(node_name, ask, decision, mig_key=key, **who)
                        return decision, ""
            return None, f"{REASON_NO_MIG_INSTANCE} {ask.mig_profile} (taken since filter)"
        req = ask.to_request()
        gpus = self._choose_gpus(built, node, ask, req)
        if gpus is None:
            codes, texts = self._verdicts(built, ask, np.array([node]))
            return None, f"no longer fits: {texts[int(codes[0])] or 'no GPU set fits'}"
        with self._lock:
            if self._built is not built:  # rebuilt meanwhile: the indices may have moved; let it retry
                return None, "the cluster's GPU inventory changed during bind; retry"
            result = built.ledger.reserve(node, gpus, req)
            if isinstance(result, Refusal):
                return None, str(result)
            cores = ask.cores_percent or (0 if ask.memory_mib else 100)
            decision = Decision(
                node_name,
                ask.container,
                gpus,
                tuple(uuids.get(g, "") for g in gpus),
                ask.memory_mib,
                cores,
                bind_time=now,
            )
            self._pods[uid] = _Bound(node_name, ask, decision, placement=result, **who)
            return decision, ""

    def _choose_gpus(
        self, built: _Ledgered, node: int, ask: PodGpuRequest, req: Request
    ) -> tuple[int, ...] | None:
        """The policy's advice if it is usable, else best fit; for several GPUs the best-linked set."""
        view = built.ledger.view
        usable = (
            built.healthy[node]
            & (view.gpu_tasks[node] < built.split[node])
            & built.ledger.gpu_fits(req, node)
        )
        free = np.flatnonzero(usable)
        if len(free) < req.num_gpu:
            return None
        if req.num_gpu == 1:
            placer = self._placer(built, ask)
            try:
                advice = tuple(int(g) for g in placer.policy.pick_gpus(view, req, node))
            except Exception:
                placer.fallbacks[("pick_gpus", "exception")] += 1
                advice = ()
            if len(advice) == 1 and 0 <= advice[0] < MAX_GPUS_PER_NODE and usable[advice[0]]:
                return advice
            if req.gpu_milli >= MILLI_PER_GPU:
                return (int(free[0]),)
            return (int(free[np.argmin(view.free_gpu_milli[node][free])]),)  # best fit: least free
        topology = built.topologies[node]
        if topology is None or free.max() >= topology.n_gpus:
            return tuple(int(g) for g in free[: req.num_gpu])
        sets = itertools.combinations((int(g) for g in free), req.num_gpu)
        return min(sets, key=lambda gs: (topology.hop_cost(gs), gs))

    # ---- preempt ------------------------------------------------------------------------------------

    def preempt(self, pod: Mapping[str, Any], victims: Mapping[str, list[str]]) -> dict[str, list[str]]:
        """Of kube-scheduler's preemption candidates (node -> UIDs of the pods it would evict), the nodes
        where evicting exactly those pods frees a GPU the pod fits on; the victims are kept as proposed.

        kube-scheduler picks victims with its own plugins, which see only ``gpuslice.io/gpu`` counts; this
        what-if over the ledger drops the candidates whose evictions would free the wrong GPUs.
        """
        try:
            ask = _ask(pod)
        except InvalidRequest:
            return {}
        if not ask.wants_gpu:
            return dict(victims)
        built = self._ledgered()
        with self._lock:
            return {
                name: uids
                for name, uids in victims.items()
                if (node := built.index.get(name)) is not None and self._fits_without(built, node, ask, uids)
            }

    def _fits_without(self, built: _Ledgered, node: int, ask: PodGpuRequest, uids: list[str]) -> bool:
        """Would ``ask`` fit on ``node`` with the pods ``uids`` gone? Reads only (a copy of one row)."""
        gone = [
            b
            for u in uids
            if (b := self._pods.get(u)) is not None and b.node == built.ledger.node_names[node]
        ]
        if ask.mig_profile:
            freed = {b.mig_key for b in gone if b.mig_key is not None}
            name = built.ledger.node_names[node]
            return any(
                slot.profile == ask.mig_profile
                and gpu.healthy
                and ((key := (name, gpu.index, slot.start)) not in self._mig_used or key in freed)
                for gpu in built.inventories[node].gpus
                for slot in gpu.mig
            )
        view = built.ledger.view
        free = view.free_gpu_milli[node].copy()
        memory = view.free_gpu_memory_bytes[node].copy()
        tasks = view.gpu_tasks[node].copy()
        for b in gone:
            if b.placement is not None:
                for g in b.placement.gpus:
                    free[g] += b.placement.request.gpu_milli
                    memory[g] += b.placement.request.gpu_memory_bytes
                    tasks[g] -= 1
        req = ask.to_request()
        usable = (
            built.healthy[node]
            & (tasks < built.split[node])
            & (free >= req.gpu_milli)
            & (memory >= req.gpu_memory_bytes)
        )
        return bool(built.ledger.model_allowed(req)[node]) and int(usable.sum()) >= req.num_gpu

    # ---- events -------------------------------------------------------------------------------------

    def _remember(self, pod: Mapping[str, Any]) -> None:
        _, _, uid = _pod_meta(pod)
        if uid:
            self._seen[uid] = pod
            self._seen.move_to_end(uid)
            while len(self._seen) > SEEN_PODS_MAX:
                self._seen.popitem(last=False)

    def _explain(self, pod: Mapping[str, Any], total: int, reasons: Counter[str]) -> None:
        """Post 'gpuslice: 0/N nodes fit: …' as a Warning Event, at most once a minute per message."""
        namespace, name, uid = _pod_meta(pod)
        detail = "; ".join(f"{count} {reason}" for reason, count in reasons.most_common())
        message = f"gpuslice: 0/{total} nodes fit: {detail}"
        now = time.monotonic()
        last = self._last_event.get(uid)
        if last is not None and last[0] == message and now - last[1] < EVENT_REPEAT_S:
            return
        self._last_event[uid] = (message, now)
        self._post_event(namespace, name, uid, "FailedScheduling", message)

    def _post_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        """A Warning Event on a pod, sent off the request path."""

        def post() -> None:
            try:
                self.api.create_event(namespace, name, uid, reason, message)
            except Exception:
                log.warning("could not post an Event on %s/%s", namespace, name, exc_info=True)

        self._events.submit(post)

    def flush_events(self) -> None:
        """Wait until every queued Event has been sent (tests; shutdown)."""
        self._events.submit(lambda: None).result()

    # ---- checks -------------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """The ledger's own invariants plus: no GPU holds more shares than its splitCount, and every
        cached verdict that its version says is current equals one computed afresh."""
        built = self._ledgered()
        with self._lock:
            built.ledger.check_invariants()
            tasks = built.ledger.view.gpu_tasks
            over = built.healthy & (tasks > built.split[:, None])
            if over.any():
                raise AssertionError(f"GPUs over their share limit: {np.argwhere(over).tolist()}")
            for req, cache in built.verdicts.items():
                current = np.flatnonzero(cache.version == built.ledger.view.version)
                stale = current[cache.codes[current] != self._row_codes(built, req, current)]
                if len(stale):
                    raise AssertionError(f"outdated verdicts cached for {req}: nodes {stale.tolist()}")
            if len(set(self._mig_used)) != len(self._mig_used):
                raise AssertionError("a MIG instance is held twice")

    @property
    def ledger(self) -> Ledger:
        return self._ledgered().ledger


def _ask(pod: Mapping[str, Any]) -> PodGpuRequest:
    """The pod's gpuslice request, its placement policy name checked against the registry."""
    ask = pod_gpu_request(pod)
    if ask.policy:
        try:
            placement_policy(ask.policy)
        except UnknownPolicy as err:
            raise InvalidRequest(f"annotation {ANNOTATION_PLACEMENT_POLICY}: {err}") from None
    return ask


def _priority(pod: Mapping[str, Any]) -> int:
    """spec.priority (the API server's Priority admission resolves priorityClassName into it); 0 if unset."""
    value = (pod.get("spec") or {}).get("priority")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def _models_text(ask: PodGpuRequest, models: tuple[str, ...]) -> str:
    parts = []
    if ask.gpu_models:
        parts.append(f"pod wants {'|'.join(ask.gpu_models)}")
    if ask.excluded_gpu_models:
        parts.append(f"pod excludes {'|'.join(ask.excluded_gpu_models)}")
    return ", ".join(parts) + f" (cluster has {', '.join(models) or 'no GPUs'})"


def _rescale(raw: np.ndarray) -> np.ndarray:
    """Scores to 0..MAX_EXTENDER_PRIORITY integers: best 10, worst feasible 0, infeasible 0."""
    out = np.zeros(len(raw), dtype=np.int64)
    ok = np.isfinite(raw)
    if not ok.any():
        return out
    low, high = raw[ok].min(), raw[ok].max()
    if high == low:
        out[ok] = MAX_EXTENDER_PRIORITY
        return out
    out[ok] = np.rint((raw[ok] - low) / (high - low) * MAX_EXTENDER_PRIORITY).astype(np.int64)
    return out


# ---- HTTP ---------------------------------------------------------------------------------------------

_JSON = "application/json"


def create_app(state: ClusterState, events: Iterable[WatchEvent] | None = None) -> Any:
    """The extender's ASGI app: POST /filter, /prioritize, /preempt, /bind (extender/v1), GET /healthz.

    ``events``: a watch source followed on a daemon thread from startup (``KubernetesApi.events()``).
    """

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
            # a prioritize error only costs this extender's scores (research §1.2)
            return Response(wire.encode([]), media_type=_JSON)
        return Response(wire.host_priorities(names, scores), media_type=_JSON)

    app.add_route("/filter", filter_, methods=["POST"])
    app.add_route("/prioritize", prioritize, methods=["POST"])

    @app.post("/preempt")
    async def preempt(request: fastapi.Request) -> JSONResponse:
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
                    n: [_pod_meta(p)[2] for p in wire.field(v, "Pods") or []] for n, v in candidates.items()
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
        error = state.bind(
            str(wire.field(body, "PodNamespace") or "default"),
            str(wire.field(body, "PodName") or ""),
            str(wire.field(body, "PodUID") or ""),
            str(wire.field(body, "Node") or ""),
        )
        return JSONResponse({"Error": error})

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "conflicts": state.conflicts}

    instrument_extender(app)  # GET /metrics; latency and result of every verb (observe/k8s_metrics.py)
    return app
