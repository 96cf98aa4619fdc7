"""gpuslice decides node and GPUs for DRA claims; kube-scheduler then binds the pod where they are.

kube-scheduler v1.37's DRA plugin allocates an unallocated claim itself (first fit inside a node),
but takes a claim that is already allocated as it is: its Filter passes only the nodes the
allocation's nodeSelector names, Reserve adds the pod to ``reservedFor``, and the pod binds there. So
a pod that should be placed by gpuslice carries the scheduling gate ``GATE`` (kube-scheduler leaves
gated pods alone), and one pass of this allocator does, per gated pod, oldest first:

```text
claims of the pod        -> every one for gpuslice's shared or whole-GPU class, one request, no selector;
                            several (one per asking container) all on one node or none (``place_pod``)
ledger over the pools    -> one node per pool, one GPU per shared device; every allocated claim's
                            consumed memory and cores reserved (kube-scheduler's allocations too)
Request(num_gpu, milli, memory) -> the placer: feasible & the pod's nodeSelector, the policy's node
                            choice, its GPU choice (inside one value group under a matchAttribute)
write status.allocation  -> results with shareID and consumedCapacity, the class config, nodeSelector
remove the gate          -> kube-scheduler binds the pod to that node
```

The placement policy is built as the extender builds it: FGD-style policies get the operator's target
workload (``--target-workload``), else the shapes of the claims allocated when the pass began, else
the first pod's own shape, so ``fgd`` decides here as it does in ``gpuslice sim`` given the same target.

A pod whose claims gpuslice does not decide (MIG profiles, selectors, other drivers) is ungated
unallocated: kube-scheduler's own allocator decides those. A pod nothing fits keeps its gate and gets
an Event with the placer's reason ("0/3 nodes fit: 3 insufficient GPU memory").
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpuslice.errors import InvalidRequest, LedgerError
from gpuslice.hardware.node import MAX_GPUS_PER_NODE, NodeSpec
from gpuslice.k8s import quantity
from gpuslice.k8s.dra.claim_ask import ClaimAsk, aligned_mib, claim_ask
from gpuslice.k8s.dra.classes import CLASS_SHARED, CLASS_WHOLE
from gpuslice.k8s.dra.preempt import Holder, PreemptionPlan, plan_preemption
from gpuslice.k8s.dra.slices import (
    CAPACITY_CORES,
    CAPACITY_MEMORY,
    DRIVER,
    TYPE_GPU,
    consumed_share,
)
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode
from gpuslice.observe.cluster_metrics import INVALID_REQUEST
from gpuslice.policies import DEFAULT_PLACEMENT, PolicyContext, make_policy
from gpuslice.scheduler.placer import Placer, Unplaced
from gpuslice.units import MiB
from gpuslice.workload.request import MILLI_PER_GPU, Request, share_milli
from gpuslice.workload.target import TargetWorkload

__all__ = ["GATE", "AllocatorApi", "ClaimPlacement", "DraAllocator", "Inventory"]

log = logging.getLogger(__name__)

GATE = "gpuslice.io/dra-allocate"
_HUGE = 1 << 60  # DRA pods ask the ledger for GPUs only


class AllocatorApi(Protocol):
    """The API calls one pass needs (``DraApi`` in production)."""

    def list_slices(self) -> list[dict[str, Any]]: ...
    def list_claims(self) -> list[dict[str, Any]]: ...
    def list_pods(self) -> list[dict[str, Any]]: ...
    def delete_pod(self, namespace: str, name: str, uid: str) -> None: ...
    def write_allocation(self, claim: Mapping[str, Any], allocation: Mapping[str, Any]) -> None: ...
    def ungate(self, pod: Mapping[str, Any], gate: str) -> None: ...
    def pod_event(self, pod: Mapping[str, Any], reason: str, message: str) -> None: ...


@dataclass
class _Gpu:
    device: str
    memory_mib: int
    attributes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClaimPlacement:
    """Where a claim goes: a node, its GPUs, the memory of each in MiB (0: each GPU's whole memory, a
    whole GPU or a share that names no memory) and the compute percent of each."""

    node: str
    gpus: tuple[_Gpu, ...]
    memory_mib: int
    cores: int


class Inventory:
    """The pools' shared GPUs as a ledger, with every allocated claim's consumption reserved."""

    def __init__(
        self,
        slices: Sequence[Mapping[str, Any]],
        claims: Sequence[Mapping[str, Any]],
        policy: str,
        priorities: Mapping[str, int] | None = None,
        target: TargetWorkload | None = None,
    ):
        newest: dict[str, int] = {}
        for s in slices:
            spec = s["spec"]
            if spec.get("driver") == DRIVER:
                pool = spec["pool"]
                newest[pool["name"]] = max(newest.get(pool["name"], 0), int(pool["generation"]))
        gpus: dict[str, list[_Gpu]] = {name: [] for name in sorted(newest)}
        for s in slices:
            spec = s["spec"]
            if spec.get("driver") != DRIVER or int(spec["pool"]["generation"]) != newest.get(
                spec["pool"]["name"]
            ):
                continue
            for d in spec.get("devices") or []:
                attrs = d.get("attributes") or {}
                if (attrs.get("type") or {}).get("string") == TYPE_GPU and d.get("allowMultipleAllocations"):
                    mib = quantity.bytes_as_mib(d["capacity"][CAPACITY_MEMORY]["value"], CAPACITY_MEMORY)
                    gpus[spec["pool"]["name"]].append(_Gpu(d["name"], mib, attrs))
        self.nodes = [n for n, g in gpus.items() if g and len(g) <= MAX_GPUS_PER_NODE]
        self.gpus = [sorted(gpus[n], key=lambda g: g.device) for n in self.nodes]
        self.ledger: Ledger | None = None
        self.placer: Placer | None = None  # built at the first placement (``_placer``)
        self.policy, self.target = policy, target
        self.shapes: list[Request] = []  # every allocated claim's request: the default target workload
        self.holders: list[Holder] = []  # every allocated claim on these nodes, for preemption
        self._held: dict[str, list[Placement]] = {}  # claim uid -> its reservations in the ledger
        if not self.nodes:
            return
        specs = [
            NodeSpec(n, _HUGE, _HUGE, len(g), "gpu", gpu_memory_each=tuple(x.memory_mib * MiB for x in g))
            for n, g in zip(self.nodes, self.gpus, strict=True)
        ]
        self.ledger = Ledger(specs)
        index = {(n, g.device): (i, k) for i, n in enumerate(self.nodes) for k, g in enumerate(self.gpus[i])}
        priorities = priorities or {}
        for c in claims:
            allocation = (c.get("status") or {}).get("allocation") or {}
            taken: list[int] = []
            held: list[Placement] = []
            milli = memory = 0
            node = -1
            for r in (allocation.get("devices") or {}).get("results") or []:
                where = index.get((r.get("pool"), r.get("device")))
                if r.get("driver") != DRIVER or where is None:
                    continue
                node, gpu = where
                mib, cores = consumed_share(r.get("consumedCapacity") or {}, self.gpus[node][gpu].memory_mib)
                req = Request(
                    0, num_gpu=1, gpu_milli=max(1, min(cores, 100)) * 10, gpu_memory_bytes=mib * MiB
                )
                placed = self.ledger.reserve(node, (gpu,), req)
                if isinstance(placed, Refusal):  # allocated beyond capacity
                    log.error("claims allocated on %s %s exceed its capacity", r.get("pool"), r.get("device"))
                else:
                    held.append(placed)
                taken.append(gpu)
                milli, memory = req.gpu_milli, req.gpu_memory_bytes
            if taken:
                self.shapes.append(Request(0, num_gpu=len(taken), gpu_milli=milli))
                pods = tuple(
                    (str(c["metadata"]["namespace"]), str(ref.get("name")), str(ref.get("uid")))
                    for ref in (c.get("status") or {}).get("reservedFor") or []
                    if ref.get("resource") == "pods"
                )
                top = max((priorities.get(uid, 0) for _, _, uid in pods), default=0)
                uid = str(c["metadata"].get("uid", ""))
                self.holders.append(Holder(uid, node, tuple(taken), milli, memory, pods, top))
                self._held[uid] = held

    def _placer(self, req: Request) -> Placer:
        """The placer of this pass; its policy's target as the extender's (see the module docstring)."""
        if self.placer is None:
            assert self.ledger is not None
            target = self.target or TargetWorkload.from_requests(self.shapes or [req])
            context = PolicyContext(np.random.default_rng(0), target=target)
            self.placer = Placer(self.ledger, make_policy(self.policy, self.ledger.view, context))
        return self.placer

    def free(self, node: int) -> tuple[list[int], list[int], list[int]]:
        """Free milli, free memory and total memory of each GPU of ``node``."""
        assert self.ledger is not None
        view, n = self.ledger.view, len(self.gpus[node])
        return (
            [int(x) for x in view.free_gpu_milli[node][:n]],
            [int(x) for x in view.free_gpu_memory_bytes[node][:n]],
            [int(x) for x in view.gpu_memory_capacity_bytes[node][:n]],
        )

    def request(self, ask: ClaimAsk) -> Request:
        """The ledger request of ``ask``; InvalidRequest says why it is not a valid one."""
        if ask.count < 1 or not 0 < ask.cores <= 100 or ask.memory_mib < 0:
            raise InvalidRequest(
                f"request {ask.request}: count, memory and cores must be positive (cores at most 100)"
            )
        whole = ask.exclusive or ask.count > 1
        biggest = max((g.memory_mib for gs in self.gpus for g in gs), default=0)
        mib = 0 if whole or not ask.memory_mib else aligned_mib(ask.memory_mib)
        return Request(
            0,
            num_gpu=ask.count,
            gpu_milli=MILLI_PER_GPU if whole else share_milli(ask.cores, True),
            gpu_memory_bytes=0 if whole else (mib or biggest) * MiB,
        )

    def preemption(
        self,
        asks: Sequence[ClaimAsk],
        priority: int,
        node_name: str | None,
        going: frozenset[str] = frozenset(),
    ) -> PreemptionPlan | None:
        """Claims of lower-priority pods whose release makes room for all of one pod's ``asks`` on one
        node (see ``preempt``); the claims in ``going`` (their pods are being preempted already) are no
        victims. A victim set is judged as the pod will be placed: its claims given back in the ledger,
        the pod's claims held together by the policy's GPU picks (``_hold_together``), all undone."""
        if self.ledger is None or not asks:
            return None
        try:
            reqs = [self.request(ask) for ask in asks]
        except InvalidRequest:
            return None
        self._placer(reqs[0])
        nodes = [i for i, n in enumerate(self.nodes) if node_name is None or n == node_name]
        holders = [h for h in self.holders if h.claim_uid not in going]

        def fits_without(node: int, victims: Sequence[Holder]) -> bool:
            assert self.ledger is not None
            for victim in victims:
                for placement in self._held[victim.claim_uid]:
                    self.ledger.release(placement)
            try:
                trial = self._reserve_together(asks, reqs, node)
                for placement in trial or ():
                    self.ledger.release(placement)
                return trial is not None
            finally:
                for victim in victims:
                    self._held[victim.claim_uid] = [self._again(p) for p in self._held[victim.claim_uid]]

        return plan_preemption(priority, holders, self.free, nodes, fits_without)

    def _again(self, placement: Placement) -> Placement:
        """Reserve again a placement given back a moment ago for a what-if: only what was freed is
        taken, so a refusal is a broken ledger."""
        assert self.ledger is not None
        again = self.ledger.reserve(placement.node, placement.gpus, placement.request)
        if isinstance(again, Refusal):
            raise LedgerError(f"a claim given back for a what-if cannot be held again: {again}")
        return again

    def place(self, ask: ClaimAsk, node_name: str | None) -> ClaimPlacement | Unplaced:
        """Decide and reserve ``ask``, or say why no node can take it now (the fit rule's codes counted
        over the nodes, as every home's refusal reads). InvalidRequest for an ask no GPU could serve."""
        req = self.request(ask)
        if self.ledger is None:
            return Unplaced(req, 0, note=f"no node publishes {DRIVER} GPUs")
        placer = self._placer(req)
        feasible = placer.feasible(req)
        if node_name is not None:
            feasible &= np.array([n == node_name for n in self.nodes])
        choices = {}
        for node in np.flatnonzero(feasible):
            gpus = self._pick(req, int(node), ask.match_attribute)
            if gpus is None:
                feasible[node] = False
            else:
                choices[int(node)] = gpus
        if not feasible.any():
            unplaced = Unplaced.explained(req, self.ledger)
            if unplaced.reasons:
                return unplaced
            return dataclasses.replace(unplaced, note="the pod's node selector or the claim's constraint")
        node = placer.choose_node(req, feasible)
        placed = self.ledger.reserve(node, choices[node], req)
        if isinstance(placed, Refusal):  # the mask said it fits: only a broken ledger gets here
            return Unplaced(
                req, self.ledger.node_count, Counter({placed.code: 1}), f"node {self.nodes[node]}"
            )
        return self._claim_placement(ask, req, node, choices[node])

    def place_pod(
        self, asks: Sequence[ClaimAsk], node_name: str | None
    ) -> tuple[ClaimPlacement, ...] | Unplaced:
        """Every gpuslice claim of one pod on one node, all or none (each asking container's claim, as the
        webhook writes them, or claims a user wrote). One claim: ``place``. Several: among the nodes where
        each fits alone, the policy's choice for the first; there each claim's GPUs are picked with the
        ones before it held, and a node where they do not fit together is given back whole before the
        next is tried. InvalidRequest for an ask no GPU could serve."""
        if len(asks) == 1:
            placed = self.place(asks[0], node_name)
            return placed if isinstance(placed, Unplaced) else (placed,)
        reqs = [self.request(ask) for ask in asks]
        if self.ledger is None:
            return Unplaced(reqs[0], 0, note=f"no node publishes {DRIVER} GPUs")
        placer = self._placer(reqs[0])
        feasible = np.array([node_name is None or n == node_name for n in self.nodes])
        for k, req in enumerate(reqs):
            alone = placer.feasible(req)
            if not (feasible & alone).any():  # this claim fits nowhere allowed, even alone
                why = f"claim {k + 1} of the pod's {len(asks)}"
                if alone.any():
                    why += " fits no node the pod's node selector allows"
                return dataclasses.replace(Unplaced.explained(req, self.ledger), note=why)
            feasible &= alone
        while feasible.any():
            node = placer.choose_node(reqs[0], feasible)
            held = self._hold_together(asks, reqs, node)
            if held is not None:
                return held
            feasible[node] = False
        return Unplaced(
            reqs[0], self.ledger.node_count, note=f"the pod's {len(asks)} claims fit no node together"
        )

    def _hold_together(
        self, asks: Sequence[ClaimAsk], reqs: Sequence[Request], node: int
    ) -> tuple[ClaimPlacement, ...] | None:
        """Reserve every claim on ``node``, each GPU pick seeing the ones before it held; None, with
        nothing held, if one does not fit."""
        held = self._reserve_together(asks, reqs, node)
        if held is None:
            return None
        return tuple(
            self._claim_placement(ask, req, node, placed.gpus)
            for ask, req, placed in zip(asks, reqs, held, strict=True)
        )

    def _reserve_together(
        self, asks: Sequence[ClaimAsk], reqs: Sequence[Request], node: int
    ) -> list[Placement] | None:
        """The ledger's reservations of every claim on ``node``, each GPU pick seeing the ones before it
        held; None, with nothing held, if one does not fit."""
        assert self.ledger is not None
        held: list[Placement] = []
        for ask, req in zip(asks, reqs, strict=True):
            gpus = self._pick(req, node, ask.match_attribute)
            placed = None if gpus is None else self.ledger.reserve(node, gpus, req)
            if not isinstance(placed, Placement):
                for placement in held:
                    self.ledger.release(placement)
                return None
            held.append(placed)
        return held

    def _claim_placement(self, ask: ClaimAsk, req: Request, node: int, gpus: Sequence[int]) -> ClaimPlacement:
        """The decision for ``ask`` reserved as ``req`` on ``gpus`` of ``node``: each GPU's memory as the
        request policy rounds it (0: the whole GPU's) and its compute percent."""
        whole = req.gpu_milli == MILLI_PER_GPU and not req.gpu_memory_bytes
        cores = 100 if whole else ask.cores
        mib = 0 if whole or not ask.memory_mib else aligned_mib(ask.memory_mib)
        return ClaimPlacement(self.nodes[node], tuple(self.gpus[node][g] for g in gpus), mib, cores)

    def _pick(self, req: Request, node: int, attribute: str) -> tuple[int, ...] | None:
        assert self.placer is not None
        if not attribute:
            return self.placer.pick_gpus(req, node)
        domain, _, name = attribute.rpartition("/")
        key = name if domain == DRIVER else attribute
        groups: dict[str, list[int]] = {}
        for k, g in enumerate(self.gpus[node]):
            value = g.attributes.get(key)
            if value is not None:
                groups.setdefault(str(sorted(value.items())), []).append(k)
        fits = self.ledger.view.gpu_fits(req, node) if self.ledger else None
        # the tightest group that still fits the request, as best fit does with nodes
        ranked = sorted(
            groups.values(), key=lambda ks: sum(bool(fits[k]) for k in ks) if fits is not None else 0
        )
        for ks in ranked:
            usable = np.zeros(MAX_GPUS_PER_NODE, dtype=bool)
            usable[ks] = True
            gpus = self.placer.pick_gpus(req, node, usable)
            if gpus is not None:
                return gpus
        return None


def _top_code(unplaced: Unplaced) -> RefusalCode:
    """The refusal most nodes gave; no node at all, or none the pod's selector or constraint leaves:
    ``NO_SUCH_NODE``."""
    top = unplaced.reasons.most_common(1)
    return top[0][0] if top else RefusalCode.NO_SUCH_NODE


def _allocated_pools(claim: Mapping[str, Any]) -> set[str]:
    """The nodes (pools) where ``claim`` holds gpuslice GPUs already."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return {str(r.get("pool")) for r in results if r.get("driver") == DRIVER}


def _allocation(ask: ClaimAsk, node: str, gpus: Sequence[_Gpu], mib: int, cores: int) -> dict[str, Any]:
    """The claim's ``status.allocation``: one result per GPU, consumed capacity as the request policy
    counts it (memory 0: the policy's default, all of the GPU on a step), the class's configuration."""
    from gpuslice.k8s.dra.classes import device_classes
    from gpuslice.k8s.dra.slices import memory_default_mib

    results = [
        {
            "request": ask.request,
            "driver": DRIVER,
            "pool": node,
            "device": g.device,
            "shareID": str(uuid.uuid4()),
            "consumedCapacity": {
                CAPACITY_MEMORY: f"{mib or memory_default_mib(g.memory_mib * MiB)}Mi",
                CAPACITY_CORES: str(cores),
            },
        }
        for g in gpus
    ]
    name = CLASS_WHOLE if ask.exclusive else CLASS_SHARED
    spec = next(c["spec"] for c in device_classes() if c["metadata"]["name"] == name)
    config = [{"source": "FromClass", "requests": [ask.request], **entry} for entry in spec.get("config", [])]
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "devices": {"results": results, "config": config},
        "nodeSelector": {"nodeSelectorTerms": [term]},
        # kube-scheduler fills in a missing timestamp when it reserves the claim, and the API server
        # refuses that as a change of the allocation: set it here.
        "allocationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class DraAllocator:
    """One ``run_once`` = one pass over the gated pods (see the module docstring)."""

    def __init__(
        self, api: AllocatorApi, policy: str = DEFAULT_PLACEMENT, target: TargetWorkload | None = None
    ) -> None:
        self.api = api
        self.policy = policy
        self.target = target
        self.decided = 0
        self._told: dict[str, str] = {}  # pod UID -> the last reason posted, so each is posted once
        self._preempting: dict[str, set[str]] = {}  # pod UID -> claims it evicted, while they are held
        self.preemptions = 0
        # pod UID -> (reason code, time.time() of its first refusal) of each gated pod not placed: the
        # metrics' pending pods (observe/cluster_metrics.py); gone once it is ungated or no longer gated
        self.pending: dict[str, tuple[str, float]] = {}

    def _tell(self, pod: Mapping[str, Any], message: str, code: str) -> None:
        uid = str(pod["metadata"].get("uid", ""))
        waiting = self.pending.get(uid)
        self.pending[uid] = (code, time.time() if waiting is None else waiting[1])
        if self._told.get(uid) != message:
            self._told[uid] = message
            self.api.pod_event(pod, "GpusliceUnplaced", message)

    def run_once(self) -> int:
        """Allocate and ungate what can be; the number of pods ungated."""
        every = self.api.list_pods()
        priorities = {str(p["metadata"].get("uid")): int(p["spec"].get("priority") or 0) for p in every}
        gated = [
            p for p in every if any(g.get("name") == GATE for g in p["spec"].get("schedulingGates") or [])
        ]
        pods = sorted(
            gated,
            key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
        )
        still = {str(p["metadata"].get("uid", "")) for p in pods}
        self.pending = {uid: why for uid, why in self.pending.items() if uid in still}
        self._told = {uid: said for uid, said in self._told.items() if uid in still}  # bounded by the gated
        if not pods:
            return 0
        claims = self.api.list_claims()
        by_key = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        inventory = Inventory(self.api.list_slices(), claims, self.policy, priorities, self.target)
        ungated = 0
        for pod in pods:
            try:
                placed = self._one(pod, by_key, inventory)
                if placed:
                    self.pending.pop(str(pod["metadata"].get("uid", "")), None)
                ungated += placed
            except Exception as err:  # an API refusal (409: changed meanwhile) or outage: next pass retries
                log.warning("pod %s/%s: %s", pod["metadata"]["namespace"], pod["metadata"]["name"], err)
        return ungated

    def _one(
        self, pod: Mapping[str, Any], by_key: Mapping[tuple[str, str], dict[str, Any]], inventory: Inventory
    ) -> int:
        namespace = pod["metadata"]["namespace"]
        # a claim made from a template: kube-controller-manager names it in the pod's status
        made = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        names = [
            r.get("resourceClaimName") or made.get(r.get("name"))
            for r in pod["spec"].get("resourceClaims") or []
        ]
        wanted = [by_key.get((namespace, str(n))) for n in names]
        if any(c is None for c in wanted):
            return 0  # a claim not created yet (from a template: by kube-controller-manager): wait
        pending = [c for c in wanted if c is not None and not (c.get("status") or {}).get("allocation")]
        try:
            ours = [(c, a) for c in pending if (a := claim_ask(c)) is not None]
        except InvalidRequest as err:  # a quantity no one can allocate: said on the pod, once
            self._tell(pod, f"claim refused: {err}", INVALID_REQUEST)
            return 0
        if ours:
            selector = (pod["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
            held = {node for c in wanted if c is not None for node in _allocated_pools(c)}
            if len(held) > 1 or (held and selector is not None and held != {selector}):
                self._tell(
                    pod,
                    f"its claims are allocated on {', '.join(sorted(held))} already: one node only",
                    INVALID_REQUEST,  # no placement can mend it
                )
                return 0
            node_name = next(iter(held)) if held else selector  # the rest of a pod half written before
            said = ", ".join(c["metadata"]["name"] for c, _ in ours)
            asks = [a for _, a in ours]
            try:
                decision = inventory.place_pod(asks, node_name)
            except InvalidRequest as err:
                self._tell(pod, f"claim {said} refused: {err}", INVALID_REQUEST)
                return 0
            if isinstance(decision, Unplaced):
                why = self._preempt(pod, asks, inventory)
                code = RefusalCode.PREEMPTING if why else _top_code(decision)
                self._tell(
                    pod, f"{'claim' if len(asks) == 1 else 'claims'} {said}: {decision}{why}", code.label
                )
                return 0
            for (claim, ask), placed in zip(ours, decision, strict=True):
                allocation = _allocation(ask, placed.node, list(placed.gpus), placed.memory_mib, placed.cores)
                self.api.write_allocation(claim, allocation)
                claim.setdefault("status", {})["allocation"] = allocation
                self.decided += 1
                log.info(
                    "claim %s/%s -> %s %s",
                    namespace,
                    claim["metadata"]["name"],
                    placed.node,
                    [g.device for g in placed.gpus],
                )
        self.api.ungate(pod, GATE)
        return 1

    def _preempt(self, pod: Mapping[str, Any], asks: Sequence[ClaimAsk], inventory: Inventory) -> str:
        """Evict the cheapest set of lower-priority claim holders that makes room; what was done, or ''."""
        uid = str(pod["metadata"].get("uid", ""))
        priority = int(pod["spec"].get("priority") or 0)
        held = {h.claim_uid for h in inventory.holders}
        # a preemption is over once none of its victims' claims is held any more: forget it
        self._preempting = {u: claims for u, claims in self._preempting.items() if claims & held}
        if uid in self._preempting:
            return "; waiting for the pods it preempted to end"
        selector = (pod["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
        going = frozenset().union(*self._preempting.values())  # as in every home: never evicted twice
        plan = inventory.preemption(asks, priority, selector, going)
        if plan is None:
            return ""
        self._preempting[uid] = {h.claim_uid for h in plan.victims}
        gone = [p for h in plan.victims for p in h.pods]
        node = inventory.nodes[plan.node]
        for namespace, name, victim_uid in gone:
            self.api.delete_pod(namespace, name, victim_uid)
            self.api.pod_event(
                {"metadata": {"namespace": namespace, "name": name, "uid": victim_uid}},
                "Preempted",
                f"gpuslice: preempted on {node} by {pod['metadata']['namespace']}/{pod['metadata']['name']} "
                f"(priority {priority})",
            )
        self.preemptions += len(gone)
        log.info("pod %s preempted %d pod(s) on %s", pod["metadata"]["name"], len(gone), node)
        return f"; preempted {len(gone)} lower-priority pod(s) on {node}, waiting for them to end"

    def run(self, stop: threading.Event, interval_s: float = 0.5) -> None:
        """Passes until ``stop`` is set; a failed pass is logged and retried."""
        while not stop.is_set():
            try:
                busy = self.run_once()
            except Exception:
                log.exception("DRA allocation pass failed; retrying")
                busy = 0
            if not busy:
                stop.wait(interval_s)
