"""Preemption: which lower-priority gpuslice pods to evict so a pod fits, and holding the room it made."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.mig import compute_slices_by_name
from gpuslice.k8s.annotations import PodGpuRequest
from gpuslice.k8s.extender import pod_slices
from gpuslice.k8s.extender.cluster import (
    BoundPod,
    ClusterCache,
    LedgerBuild,
    Nomination,
    open_slots,
    pod_ask,
    pod_meta,
    pod_priority,
)
from gpuslice.k8s.extender.verdicts import CODE_RESERVED
from gpuslice.ledger.fit import FITS, UNCURABLE, fit_codes
from gpuslice.policies.queue import JobRef
from gpuslice.scheduler.mig_choice import mig_rank
from gpuslice.scheduler.preemption import Victim, find_preemption
from gpuslice.workload.equivalent import gpu_equivalent
from gpuslice.workload.request import MILLI_PER_GPU

__all__ = ["NOMINATION_S", "Preemption"]

log = logging.getLogger(__name__)

# How long a node stays held for a pod that preempted there if it never binds (its victims' grace
# period, 30 s by default, plus kube-scheduler's retry back-off, with room to spare).
NOMINATION_S = 300.0


class Preemption:
    """Preemption: the preempt verb's what-if, and evictions the extender starts itself, over the pods
    and nominations of ``cache``."""

    def __init__(self, cache: ClusterCache) -> None:
        self._cache = cache
        self.preemptions = 0  # pods this extender evicted to make room for higher-priority ones

    def preempt(self, pod: Mapping[str, Any], victims: Mapping[str, list[str]]) -> dict[str, list[str]]:
        """Of kube-scheduler's preemption candidates (node -> UIDs of the pods it would evict), the nodes
        where the one preemption search finds room among those pods; the victims are kept as proposed.

        kube-scheduler picks victims with its own plugins, which see only ``gpuslice.io/gpu`` counts; this
        what-if over the ledger drops the candidates whose evictions would free the wrong GPUs.
        """
        try:
            ask = pod_ask(pod)
        except InvalidRequest:
            return {}
        if not ask.wants_gpu:
            return dict(victims)
        preemptor = JobRef(pod_meta(pod)[2], pod_priority(pod), pod_meta(pod)[0])
        with self._cache.lock:
            built = self._cache.ledgered()  # under the lock: the pods' placements are this build's
            return {
                name: uids
                for name, uids in victims.items()
                if (node := built.index.get(name)) is not None
                and self._search_keeps(built, node, ask, preemptor, uids)
            }

    def _search_keeps(
        self, built: LedgerBuild, node: int, ask: PodGpuRequest, preemptor: JobRef, uids: list[str]
    ) -> bool:
        """Does the one preemption search find room on ``node`` among exactly the proposed victims? Pods
        that are not gpuslice's (kube-scheduler may propose them for CPU or memory) free no GPU but stay
        evicted, so the what-if always counts them as gone."""
        proposed = [_victim(u, b) for u in uids if (b := self._cache.pods.get(u)) is not None]
        others = [u for u in uids if u not in self._cache.pods]
        if not proposed:
            return self._fits_without(built, node, ask, others)
        plan = find_preemption(
            preemptor, proposed,
            lambda _n, gone: self._fits_without(built, node, ask, [v.job_id for v in gone] + others),
            time.time(),
        )  # fmt: skip
        return plan is not None

    def _fits_without(self, built: LedgerBuild, node: int, ask: PodGpuRequest, uids: list[str]) -> bool:
        """Would ``ask`` fit on ``node`` with the pods ``uids`` gone? Called with the lock held. One slice:
        reads only (a copy of one row). Several containers' slices: ``pod_slices.fits_without``, which
        places them one after another in the ledger with the victims given back, and leaves every
        column as it found it (no copy of one row can say which GPUs the second slice would get)."""
        gone = [
            b
            for u in uids
            if (b := self._cache.pods.get(u)) is not None and b.node == built.ledger.node_names[node]
        ]
        if ask.multi:
            return pod_slices.fits_without(self._cache, built, node, ask, gone)
        if ask.mig_profile:
            freed = [p for b in gone for p in b.placements]
            candidates = self._cache.mig_candidates(built, node, ask.mig_profile, freed)
            return any(mig_rank(c) is not None for c in candidates)
        view = built.ledger.view
        free = view.free_gpu_milli[node].copy()
        memory = view.free_gpu_memory_bytes[node].copy()
        tasks = view.gpu_tasks[node].copy()
        for placement in (p for b in gone for p in b.placements):
            for g in placement.gpus:
                free[g] += placement.request.gpu_milli
                memory[g] += placement.request.gpu_memory_bytes
                tasks[g] -= 1
        req = ask.to_request()
        model_ok = built.ledger.model_allowed(req)[node : node + 1]
        slots = open_slots(built, node, tasks)
        return int(fit_codes(req, model_ok, slots[None], free[None], memory[None])[0]) == FITS

    def reserved_for_others(
        self, pod: Mapping[str, Any], node_names: list[str], codes: np.ndarray
    ) -> np.ndarray:
        """Codes with ``CODE_RESERVED`` on the nodes where a pod of at least this pod's priority preempted
        others and has not bound yet: the room it made is its own (kube-scheduler's nominated node)."""
        if not self._cache.nominations:
            return codes
        uid, priority, now = pod_meta(pod)[2], pod_priority(pod), time.monotonic()
        with self._cache.lock:
            for node, held in list(self._cache.nominations.items()):
                if held.deadline < now:
                    del self._cache.nominations[node]
            held = self._cache.nominations.items()
            held_nodes = {n for n, h in held if h.uid != uid and h.priority >= priority}
        if not held_nodes:
            return codes
        mask = np.fromiter((n in held_nodes for n in node_names), dtype=bool, count=len(node_names))
        return np.where(mask & (codes == 0), CODE_RESERVED, codes)

    def catch_up_on_victims(self, uid: str) -> None:
        """For a pod that preempted others: forget the victims the API server no longer has.

        kube-scheduler retries the pod as soon as its informer sees a victim deleted, which can be
        before this extender's own watch delivers the same event; refused then, the pod would wait for
        kube-scheduler's next periodic retry (minutes). One read per remaining victim, only while such
        a pod waits."""
        held = next((h for h in self._cache.nominations.values() if h.uid == uid), None)
        if held is None:
            return
        for victim in held.victims:
            bound = self._cache.pods.get(victim)
            if bound is None:
                continue
            try:
                gone = self._cache.api.pod_gone(bound.namespace, bound.name, victim)
            except Exception:
                log.warning("could not check victim %s/%s", bound.namespace, bound.name, exc_info=True)
                continue
            if gone:
                with self._cache.lock:
                    self._cache.forget(victim)

    def make_room(
        self,
        pod: Mapping[str, Any],
        built: LedgerBuild,
        ask: PodGpuRequest,
        node_names: list[str],
        idx: np.ndarray,
        codes: np.ndarray,
    ) -> str:
        """Make room for a pod no node can take by evicting lower-priority gpuslice pods; '' if none.

        kube-scheduler's default preemption simulates evictions with its in-tree filters only: when just
        this extender refuses a node, the simulation finds no victim and never calls the extender's
        preempt verb (Kubernetes up to at least v1.37). So the extender does what that plugin would: on
        the nodes kube-scheduler offered, the cheapest set of lower-priority victims whose removal makes
        the pod fit, found by the one preemption search of every home (``find_preemption``), deleted
        with their own grace period; the node is then held for the pod until it binds
        (``reserved_for_others``). Pods being preempted already are no victims (as in every home), and
        a node being cleared for another pod of at least this priority is left out until that pod binds
        (one nomination per node: a second would take the first pod's room). Returns the reason the pod
        waits.
        """
        namespace, name, uid = pod_meta(pod)
        priority = pod_priority(pod)
        with self._cache.lock:
            waiting = next((n for n, h in self._cache.nominations.items() if h.uid == uid), None)
            if waiting is not None:
                left = sum(1 for v in self._cache.nominations[waiting].victims if v in self._cache.pods)
                return f"preempted lower-priority pods on {waiting}; waiting for {left} of them to end"
            if not self._cache.is_current(built):  # rebuilt since filter read it: the rows have moved
                return ""
            nominations, pods = self._cache.nominations, self._cache.pods
            cleared = {n for n, h in nominations.items() if h.uid != uid and h.priority >= priority}
            going = {v for h in nominations.values() for v in h.victims}
            rows = {
                node_name: int(idx[k])
                for k, node_name in enumerate(node_names)
                if int(idx[k]) >= 0
                and not UNCURABLE[codes[k]]
                and codes[k] != CODE_RESERVED
                and node_name not in cleared
            }
            running = [_victim(u, b) for u, b in pods.items() if b.node in rows and u not in going]
            plan = find_preemption(
                JobRef(uid, priority, namespace),
                running,
                lambda node, gone: self._fits_without(built, rows[node], ask, [v.job_id for v in gone]),
                time.time(),  # the clock of the pods' bind times
            )
            if plan is None:
                return ""
            node_name = str(plan.node)
            victims = [(v.job_id, v.holding) for v in plan.victims]
            self._cache.nominations[node_name] = Nomination(
                uid, priority, frozenset(u for u, _ in victims), time.monotonic() + NOMINATION_S
            )
            self.preemptions += len(victims)
        for victim_uid, bound in victims:
            try:
                self._cache.api.delete_pod(bound.namespace, bound.name, victim_uid)
            except Exception:
                log.warning(
                    "could not delete preemption victim %s/%s", bound.namespace, bound.name, exc_info=True
                )
            self._cache.post_event(
                bound.namespace,
                bound.name,
                victim_uid,
                "Preempted",
                f"gpuslice: preempted by {namespace}/{name} (priority {priority}) on {node_name}",
            )
        log.info("pod %s/%s preempted %d pod(s) on %s", namespace, name, len(victims), node_name)
        return f"preempted {len(victims)} lower-priority pod(s) on {node_name}; waiting for them to end"


def _victim(uid: str, bound: BoundPod) -> Victim:
    """A bound gpuslice pod as the preemption search sees it; what it frees in GPUs, summed over its
    slices: each slice's GPUs × its share, or a MIG instance's compute slices / 7 (the held instance's
    profile; a pod not in the ledger, whose node has no inventory yet, by its profile name: "3g.40gb" →
    3/7; any other such pod counts one)."""
    gpus = 0.0
    for placement in bound.placements:
        if placement.mig is not None:
            gpus += gpu_equivalent(1, mig_slices=placement.mig.instance.profile.compute_slices)
        else:
            gpus += len(placement.gpus) * placement.request.gpu_milli / MILLI_PER_GPU
    if not bound.placements:
        gpus = gpu_equivalent(1, mig_slices=compute_slices_by_name(bound.ask.mig_profile or ""))
    return Victim(uid, bound.priority, float(bound.decision.bind_time), gpus, node=bound.node,
                  tenant=bound.namespace, holding=bound)  # fmt: skip
