"""What the extender knows about the cluster: the nodes' inventories and the pods bound on them, kept
from the watch, and the ledger built over them (rebuilt when an inventory changes)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuslice.errors import InvalidRequest, UnknownPolicy, UserError
from gpuslice.hardware.mig import MigGpu, MigInstance, MigLayout, mig_gpu
from gpuslice.hardware.node import MAX_GPUS_PER_NODE, NodeSpec
from gpuslice.hardware.topology import Topology, TopologyError, build_topology
from gpuslice.k8s.annotations import (
    ANNOTATION_NODE_INVENTORY,
    ANNOTATION_PLACEMENT_POLICY,
    BIND_PHASE_FAILED,
    NodeInventory,
    PodGpuRequest,
    pod_gpu_request,
)
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.extender.kube import RELISTED, KubeApi, WatchEvent
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode
from gpuslice.policies import DEFAULT_PLACEMENT, PolicyContext, placement_policy
from gpuslice.programs.loader import resolve
from gpuslice.scheduler.mig_choice import FullestByNode, MigCandidate, mig_candidate
from gpuslice.scheduler.placer import Placer
from gpuslice.units import MiB
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

__all__ = [
    "MIG_POD_REQUEST",
    "BoundPod",
    "ClusterCache",
    "LedgerBuild",
    "Nomination",
    "PendingPod",
    "VerdictCache",
    "open_slots",
    "pod_ask",
    "pod_meta",
    "pod_priority",
]

log = logging.getLogger(__name__)

EVENT_REPEAT_S = 60.0  # one Event per pod and message a minute: kube-scheduler retries far more often
SEEN_PODS_MAX = 10_000  # pods remembered from /filter so /bind needs no API read


@dataclass
class BoundPod:
    """A pod the ledger holds: where it went and what it asked for."""

    node: str
    ask: PodGpuRequest
    decision: Decision
    placement: Placement | None = None  # None while its node has no inventory; MIG: ``placement.mig``
    namespace: str = ""
    name: str = ""
    priority: int = 0  # spec.priority, set by the API server's Priority admission from priorityClassName
    # The slices of the pod's other app containers (``PodGpuRequest.more``), in spec order.
    extra: tuple[Placement, ...] = ()

    @property
    def placements(self) -> tuple[Placement, ...]:
        """Every slice the ledger holds for the pod."""
        return (self.placement, *self.extra) if self.placement is not None else self.extra


@dataclass(frozen=True, slots=True)
class Nomination:
    """A node where a pod preempted others: held for it until it binds, goes away, or ``deadline``."""

    uid: str
    priority: int
    victims: frozenset[str]
    deadline: float  # time.monotonic()


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod the extender refused and that is not bound yet: why (a fixed reason code, and the line of
    its FailedScheduling Event with the amounts), and since when it waits (time.time())."""

    namespace: str
    name: str
    code: str  # RefusalCode.label, or observe.cluster_metrics.INVALID_REQUEST
    reason: str
    since: float


@dataclass
class VerdictCache:
    """For one request shape: every node's verdict code and the ledger row version it was computed at.

    A node's verdict reads only its own ledger row (and its inventory, fixed for a build), and every
    change of a row bumps ``Ledger.version``: a bind, a release on a watch event, a reservation taken
    back. So a code is current exactly while its version matches; a new build starts a new cache.
    """

    codes: np.ndarray  # (N,) int8, CODE_NO_INVENTORY.._NO_MIG (0 = fits)
    version: np.ndarray  # (N,) int64, -1 = not computed yet


@dataclass
class LedgerBuild:
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
    verdicts: dict[Request, VerdictCache] = field(default_factory=dict)  # least recently used first
    # per MIG profile, each node's best candidate at the row version it was read (``_mig_fullest``)
    mig_fullest: FullestByNode | None = None


def open_slots(built: LedgerBuild, nodes: int | np.ndarray, tasks: np.ndarray) -> np.ndarray:
    """Bool per GPU of ``nodes`` (one node: (G,); an array of nodes: (N, G)): a GPU a share may land on,
    given ``tasks`` shares on each GPU. The one Kubernetes-only rule beside the ledger's: the GPU is
    advertised, healthy and not in MIG mode, and holds fewer shares than the node's splitCount (the
    kubelet has only that many share devices per GPU)."""
    return built.healthy[nodes] & (tasks < np.asarray(built.split[nodes])[..., None])


MIG_POD_REQUEST = Request(cpu_milli=0)  # a MIG pod's instance: its GPU is held whole already


def _mig_geometries(inventories: list[NodeInventory], specs: list[NodeSpec]) -> dict[tuple[int, int], MigGpu]:
    """(node, GPU) -> MIG table of every GPU in MIG mode whose model has one in gpuslice."""
    out = {}
    for i, inv in enumerate(inventories):
        for gpu in inv.gpus:
            if gpu.mig and gpu.index < specs[i].gpu_count:
                try:
                    out[(i, gpu.index)] = mig_gpu(gpu.model)
                except UserError:
                    continue
    return out


def _instance(layout: MigLayout | None, profile: str, start: int) -> MigInstance | None:
    """A decision's MIG instance on a GPU of that layout; None if the GPU or the profile is unknown."""
    if layout is None:
        return None
    try:
        return MigInstance(layout.gpu.profile(profile), start)
    except UserError:
        return None


def pod_meta(pod: Mapping[str, Any]) -> tuple[str, str, str]:
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


def pod_ask(pod: Mapping[str, Any]) -> PodGpuRequest:
    """The pod's gpuslice request, its placement policy name checked against the registry."""
    ask = pod_gpu_request(pod)
    if ask.policy:
        try:
            placement_policy(ask.policy)
        except UnknownPolicy as err:
            raise InvalidRequest(f"annotation {ANNOTATION_PLACEMENT_POLICY}: {err}") from None
    return ask


def pod_priority(pod: Mapping[str, Any]) -> int:
    """spec.priority (the API server's Priority admission resolves priorityClassName into it); 0 if unset."""
    value = (pod.get("spec") or {}).get("priority")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


class ClusterCache:
    """The ledger over every node with an inventory annotation, and the pods bound on them, kept from the
    watch; the holds and nominations the verbs add to it. ``ClusterState`` (the verbs), ``Verdicts`` and
    ``Preemption`` are given one and read and change the cluster through it.

    Thread-safe: ``lock`` guards every ledger change and the bookkeeping dicts (held for microseconds);
    ``node_lock(name)`` serialises binds on one node from choosing GPUs to reserving them.
    """

    def __init__(
        self,
        api: KubeApi,
        default_policy: str = DEFAULT_PLACEMENT,  # why not fgd: see the package docstring
        *,
        target: TargetWorkload | None = None,
    ) -> None:
        # A registry name, or (operator's choice only, never a pod's annotation) a verified, guarded
        # policy file; UnknownPolicy lists the known names, PolicyRejected the file's violations.
        self._default_factory = resolve(default_policy, "placement", placement_policy, on_event=log.warning)
        self.api = api
        self.default_policy = default_policy
        self.lock = threading.RLock()
        self._node_locks: dict[str, threading.Lock] = {}
        self._inventory_text: dict[str, str] = {}
        self.pods: dict[str, BoundPod] = {}
        # uid -> node of pods whose Binding exists (created here, or seen by the watch): kube-scheduler
        # may retry a bind that timed out but succeeded, and that retry must not choose GPUs again
        self.bound_to: dict[str, str] = {}
        self.mig_fallbacks: Counter[str] = Counter()  # MIG placement answers replaced by the default
        self._built: LedgerBuild | None = None
        self.seen: OrderedDict[str, Mapping[str, Any]] = OrderedDict()  # uid -> pod, from /filter
        self._events = ThreadPoolExecutor(max_workers=1, thread_name_prefix="events")
        self._last_event: dict[str, tuple[str, float]] = {}
        # uid -> why a refused pod waits; gone once a node passes it, it binds, or it is deleted
        self.pending: dict[str, PendingPod] = {}
        self.conflicts = 0  # bound pods the ledger could not hold (over-committed from outside)
        # Kinds (Node, Pod) whose first full list has been applied. Until both have, the ledger does not
        # hold every bound pod, and a decision made from it could over-commit a GPU (see ``synced``).
        self.listed: set[str] = set()
        self.nominations: dict[str, Nomination] = {}  # node name -> the pod that preempted there
        self.assumed: dict[str, float] = {}  # uid -> when filter held its GPUs (bind not seen yet)
        # FGD's expected workload, given by the operator (``--target-workload``, its GPU part: CPU is
        # kube-scheduler's business here); else the shapes of the pods bound when the ledger was built.
        self.target = target
        self.node_listeners: list[Callable[[str], None]] = []  # called with a node's name at each change

    # ---- watch --------------------------------------------------------------------------------------

    def apply(self, event: WatchEvent) -> None:
        """Take one watch event into the state."""
        if event.type == RELISTED:
            self._forget_unlisted(event)
            self.listed.add(event.kind)
        elif event.kind == "Node":
            self._apply_node(event)
        elif event.kind == "Pod":
            self._apply_pod(event)

    @property
    def synced(self) -> bool:
        """Every node and every pod of the first full lists has been taken in: only then may the
        extender decide (a restarted extender answering before would not see the pods bound by the one
        before it, and place new ones on their GPUs)."""
        return {"Node", "Pod"} <= self.listed

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
        for listener in self.node_listeners:
            listener(name)  # e.g. the bind locks: a released node lock is a Node change
        text = (meta.get("annotations") or {}).get(ANNOTATION_NODE_INVENTORY)
        if text is not None and event.type != "DELETED":
            try:
                NodeInventory.from_json(text)
            except InvalidRequest as err:
                log.warning("node %s: %s; the node is left out", name, err)
                text = None
        with self.lock:
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
        _, _, uid = pod_meta(pod)
        phase = (pod.get("status") or {}).get("phase")
        with self.lock:
            if event.type == "DELETED" or phase in ("Succeeded", "Failed"):
                self.forget(uid)
                self.drop_nomination(uid)
                return
            bound_to = (pod.get("spec") or {}).get("nodeName")
            if bound_to and uid:
                self.bound_to[uid] = str(bound_to)
                self.pending.pop(uid, None)
            if uid in self.pods:
                return
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            try:
                decision = Decision.from_annotations(annotations)
                if decision is None or decision.phase == BIND_PHASE_FAILED:
                    return
                ask = pod_ask(pod)
            except InvalidRequest as err:
                log.warning("pod %s: %s; not counted in the ledger", uid, err)
                return
            namespace, name, _ = pod_meta(pod)
            bound = BoundPod(
                decision.node, ask, decision, namespace=namespace, name=name, priority=pod_priority(pod)
            )
            self.pods[uid] = bound
            if self._built is not None:
                self._hold(self._built, uid, bound)

    def _forget_unlisted(self, event: WatchEvent) -> None:
        """After a full list: drop the nodes or pods it no longer has (deleted while no watch ran)."""
        items = event.object.get("items") or []
        with self.lock:
            if event.kind == "Node":
                listed = {str((o.get("metadata") or {}).get("name", "")) for o in items}
                for name in [n for n in self._inventory_text if n not in listed]:
                    del self._inventory_text[name]
                    self._built = None
            elif event.kind == "Pod":
                listed = {pod_meta(o)[2] for o in items}
                for uid in [u for u in (*self.pods, *self.pending) if u not in listed]:
                    self.forget(uid)

    def forget(self, uid: str) -> None:
        self.assumed.pop(uid, None)
        self.bound_to.pop(uid, None)
        bound = self.pods.pop(uid, None)
        self.seen.pop(uid, None)
        self._last_event.pop(uid, None)
        self.pending.pop(uid, None)
        if bound is None or self._built is None:
            return
        for placement in bound.placements:
            self._built.ledger.release(placement)

    # ---- ledger build -------------------------------------------------------------------------------

    def is_current(self, built: LedgerBuild) -> bool:
        """Is ``built`` still the ledger (no node or inventory changed since)? Call with the lock held."""
        return self._built is built

    def ledgered(self) -> LedgerBuild:
        """The current ledger, rebuilt (under the lock) if nodes or inventories changed."""
        built = self._built
        if built is not None:
            return built
        with self.lock:
            if self._built is None:
                self._built = self._build()
            return self._built

    def _build(self) -> LedgerBuild:
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
        # MIG GPUs with a MIG table: their instances are held in the ledger (the GPU itself held whole)
        ledger = Ledger(specs, mig=_mig_geometries(inventories, specs))
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
                held = ledger.hold_whole(i, gpu.index)
                if isinstance(held, Placement):
                    blockers.append(held)
        shapes = [b.ask.to_request() for b in self.pods.values() if b.ask.gpus]
        built = LedgerBuild(
            ledger=ledger,
            index={n: i for i, n in enumerate(names)},
            inventories=inventories,
            split=np.array([inv.split_count for inv in inventories] or [1], dtype=np.int64),
            healthy=healthy,
            topologies=[_topology(n, inv) for n, inv in zip(names, inventories, strict=True)],
            targets=TargetWorkload.from_requests(shapes) if shapes else None,
            blockers=blockers,
        )
        for uid, bound in self.pods.items():
            bound.placement, bound.extra = None, ()
            self._hold(built, uid, bound)
        log.info("ledger built: %d nodes, %d pods", len(names), len(self.pods))
        return built

    def _hold(self, built: LedgerBuild, uid: str, bound: BoundPod) -> None:
        """Put an already bound pod into the ledger from its decision: each app container's slice (a MIG
        container: its instance); a slice that does not fit is a conflict, the others stay held."""
        node = built.index.get(bound.node)
        if node is None:
            return  # its node has no inventory (yet): held when the node appears
        decision = bound.decision
        asks = {a.container: a for a in bound.ask.containers}
        slices = [c for c in decision.containers if not c.inside] or [decision]
        held: list[Placement] = []
        for one in slices:
            ask = asks.get(one.container, bound.ask)
            if one.mig is not None:
                layout = built.ledger.mig_layout(node, one.mig.gpu_index)
                instance = _instance(layout, one.mig.profile, one.mig.start)
                result: Placement | Refusal = (
                    Refusal(RefusalCode.NO_MIG_SLOT, node, gpu=one.mig.gpu_index)
                    if instance is None
                    else built.ledger.reserve_mig(node, one.mig.gpu_index, instance, MIG_POD_REQUEST)
                )
            else:
                result = built.ledger.reserve(node, one.gpu_indices, ask.to_request())
            if isinstance(result, Refusal):
                self.conflicts += 1
                log.warning(
                    "pod %s on %s does not fit the ledger (%s); counted as a conflict",
                    uid,
                    bound.node,
                    result,
                )
            else:
                held.append(result)
        if held:
            bound.placement, bound.extra = held[0], tuple(held[1:])

    def drop_nomination(self, uid: str) -> None:
        for node in [n for n, h in self.nominations.items() if h.uid == uid]:
            del self.nominations[node]

    def mig_candidates(
        self, built: LedgerBuild, node: int, profile: str, freed: Iterable[Placement] = ()
    ) -> list[MigCandidate]:
        """The node's healthy MIG GPUs as candidates of the one MIG choice (``scheduler/mig_choice.py``),
        from the instances the ledger holds there (less those of ``freed``, a what-if) and the instances
        the device plugin advertises: only the free ones of ``profile`` may be chosen. A GPU whose
        model has no MIG table in gpuslice, or no such profile, offers none."""
        gone = [p.mig for p in freed if p.mig is not None and p.node == node]
        out = []
        for gpu in built.inventories[node].gpus:
            held = built.ledger.mig_layout(node, gpu.index)
            if held is None or not gpu.healthy:
                continue
            try:
                wanted = held.gpu.profile(profile)
                existing = [MigInstance(held.gpu.profile(s.profile), s.start) for s in gpu.mig]
            except UserError:
                continue
            for hold in gone:
                if hold.gpu == gpu.index and hold.instance in held.instances:
                    held = held.without(hold.instance)
            out.append(mig_candidate((node, gpu.index), held, (wanted,), existing))
        return out

    def mig_fullest(self, built: LedgerBuild, profile: str, rows: np.ndarray) -> np.ndarray:
        """Per node of ``rows`` (ledger indices): the slices held on its fullest GPU that has a free
        instance of ``profile``, -1 where none has one (``mig_choice.FullestByNode``: at 5,000 nodes a
        bind makes one row stale instead of rebuilding every node's candidates)."""
        with self.lock:
            if built.mig_fullest is None:
                built.mig_fullest = FullestByNode(built.ledger.node_count)
            version = built.ledger.view.version
            return built.mig_fullest.fullest(
                profile, rows, version, lambda node: self.mig_candidates(built, node, profile)
            )

    def placer(self, built: LedgerBuild, ask: PodGpuRequest) -> Placer:
        name = ask.policy or self.default_policy
        placer = built.placers.get(name)
        if placer is None:
            with self.lock:
                placer = built.placers.get(name)
                if placer is None:
                    factory = self._default_factory if name == self.default_policy else placement_policy(name)
                    target = self.target or built.targets or TargetWorkload.from_requests([ask.to_request()])
                    context = PolicyContext(rng=np.random.default_rng(0), target=target)
                    placer = built.placers[name] = Placer(
                        built.ledger, factory(built.ledger.view, context), topologies=built.topologies
                    )
        return placer

    def node_lock(self, node: str) -> threading.Lock:
        with self.lock:
            return self._node_locks.setdefault(node, threading.Lock())

    # ---- events -------------------------------------------------------------------------------------

    def remember(self, pod: Mapping[str, Any]) -> None:
        _, _, uid = pod_meta(pod)
        if uid:
            self.seen[uid] = pod
            self.seen.move_to_end(uid)
            while len(self.seen) > SEEN_PODS_MAX:
                self.seen.popitem(last=False)

    def explain(
        self, pod: Mapping[str, Any], total: int, reasons: Counter[str], closest: str = "", code: str = ""
    ) -> None:
        """Post 'gpuslice: 0/N nodes fit: …[; closest: NODE (amounts)]' as a Warning Event, at most once a
        minute per message, and keep it as the pod's pending reason with ``code`` (the fixed reason code
        of the metrics) until the pod passes a node, binds or goes."""
        namespace, name, uid = pod_meta(pod)
        detail = "; ".join(f"{count} {reason}" for reason, count in reasons.most_common())
        message = f"gpuslice: 0/{total} nodes fit: {detail}" + (f"; {closest}" if closest else "")
        if uid:
            with self.lock:
                waiting = self.pending.get(uid)
                since = time.time() if waiting is None else waiting.since
                self.pending[uid] = PendingPod(namespace, name, code, message, since)
        now = time.monotonic()
        last = self._last_event.get(uid)
        if last is not None and last[0] == message and now - last[1] < EVENT_REPEAT_S:
            return
        self._last_event[uid] = (message, now)
        self.post_event(namespace, name, uid, "FailedScheduling", message)

    def post_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
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

    @property
    def ledger(self) -> Ledger:
        return self.ledgered().ledger
