"""The extender's decisions: filter, prioritize and bind, through the placement policy's Placer."""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuslice.errors import InvalidRequest
from gpuslice.k8s import extender_wire as wire
from gpuslice.k8s.annotations import (
    ANNOTATION_BIND_PHASE,
    BIND_PHASE_FAILED,
    PodGpuRequest,
)
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.extender import pod_slices
from gpuslice.k8s.extender.bind_lock import BIND_BUDGET_S, DEFAULT_LOCK_WAIT_S, BindLocks, PodBinds
from gpuslice.k8s.extender.cluster import (
    BoundPod,
    ClusterCache,
    LedgerBuild,
    open_slots,
    pod_ask,
    pod_meta,
    pod_priority,
)
from gpuslice.k8s.extender.kube import AlreadyBound, KubeApi, WatchEvent
from gpuslice.k8s.extender.preemption import Preemption
from gpuslice.k8s.extender.verdicts import (
    CODE_EXCLUDED,
    CODE_GPU,
    REASON_INVALID,
    REASON_NO_INVENTORY,
    REASON_NO_MIG_INSTANCE,
    REASON_RESERVED,
    Verdicts,
)
from gpuslice.k8s.node_lock import ask_key
from gpuslice.ledger.fit import UNCURABLE, code_of
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import RefusalCode
from gpuslice.observe.cluster_metrics import INVALID_REQUEST
from gpuslice.policies import DEFAULT_PLACEMENT
from gpuslice.scheduler.mig_choice import FullestByNode, choose_mig_instance
from gpuslice.workload.target import TargetWorkload

__all__ = ["MAX_EXTENDER_PRIORITY", "ClusterState", "FilterResult"]

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = wire.MAX_EXTENDER_PRIORITY

NAME_LISTS_MAX = 4  # node-name lists remembered with their ledger indices (kube-scheduler repeats them)

# A filter's hold on the chosen node's GPUs (``_assume``) without a bind for this long is given back:
# kube-scheduler binds within milliseconds of filtering, or retries the pod with a new filter.
ASSUMED_S = 30.0


@dataclass(frozen=True, slots=True)
class FilterResult:
    """``passed`` node names; ``failed`` (preemption may help) and ``unresolvable`` map name -> reason."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


class ClusterState:
    """The extender's verbs over the cluster: filter, prioritize, bind, preempt.

    Made of collaborators, each owning its state: ``cache`` (the watched cluster, the ledger built over
    it, the holds and nominations), ``verdicts`` (per node, does a pod fit and why not) and ``preemption``
    (the preempt verb's what-if and the evictions started here). This class owns what lasts from one
    verb to the next: the node-name lists seen and each pod's filter survivors for its prioritize, and
    the bind bookkeeping (one bind per pod at a time, the node locks).

    Thread-safe: ``cache.lock`` guards every ledger change and the bookkeeping dicts (held for
    microseconds); ``cache.node_lock(name)`` serialises binds on one node from choosing GPUs to
    reserving them.
    """

    def __init__(
        self,
        api: KubeApi,
        default_policy: str = DEFAULT_PLACEMENT,  # why not fgd: see the package docstring
        *,
        narrow: bool = False,
        target: TargetWorkload | None = None,
        lock_timeout_s: float | None = None,
        lock_wait_s: float = DEFAULT_LOCK_WAIT_S,
    ) -> None:
        self.cache = ClusterCache(api, default_policy, target=target)
        self.verdicts = Verdicts(self.cache)
        self.preemption = Preemption(self.cache)
        # Filter answers with the one node the placement policy chooses (see ``filter``); False leaves
        # the choice among all fitting nodes to kube-scheduler's scoring plus this extender's scores.
        self.narrow = narrow
        # node-name lists as asked, with their ledger indices; the survivors of each pod's last filter
        self._name_cache: list[tuple[LedgerBuild, list[str], np.ndarray]] = []
        self._passed: OrderedDict[str, tuple[LedgerBuild, list[str], np.ndarray]] = OrderedDict()
        # The node lock (k8s/node_lock.py): one pod per node from bind to Allocate, so the device
        # plugin can tell whom an Allocate is for. The CLI always turns it on; None leaves it off.
        self.binds = PodBinds()  # one bind per pod at a time: a retry reads the first one's outcome
        self.bind_locks: BindLocks | None = None
        if lock_timeout_s is not None:
            self.bind_locks = BindLocks(api, self.binds, timeout_s=lock_timeout_s, wait_s=lock_wait_s)
            self.cache.node_listeners.append(self.bind_locks.changed)

    # ---- the watched cluster (``cache``) ------------------------------------------------------------

    @property
    def api(self) -> KubeApi:
        return self.cache.api

    @property
    def synced(self) -> bool:
        return self.cache.synced

    @property
    def conflicts(self) -> int:
        return self.cache.conflicts

    @property
    def preemptions(self) -> int:
        return self.preemption.preemptions

    @property
    def ledger(self) -> Ledger:
        return self.cache.ledger

    def apply(self, event: WatchEvent) -> None:
        self.cache.apply(event)

    def follow(self, events: Iterable[WatchEvent]) -> None:
        self.cache.follow(events)

    def flush_events(self) -> None:
        self.cache.flush_events()

    def preempt(self, pod: Mapping[str, Any], victims: Mapping[str, list[str]]) -> dict[str, list[str]]:
        """The preempt verb (``Preemption.preempt``)."""
        return self.preemption.preempt(pod, victims)

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
        (``Preemption.make_room``: kube-scheduler's own preemption never reaches an extender that alone
        refuses a node), and a Warning Event on the pod says why it waits.
        """
        self.cache.remember(pod)
        try:
            ask = pod_ask(pod)
        except InvalidRequest as err:
            reason = f"{REASON_INVALID}: {err}"
            self.cache.explain(pod, len(node_names), Counter({reason: len(node_names)}), code=INVALID_REQUEST)
            return FilterResult([], {}, dict.fromkeys(node_names, reason))
        if not ask.wants_gpu:
            return FilterResult(list(node_names), {}, {})
        uid = pod_meta(pod)[2]
        if uid in self.cache.assumed:  # filtered again without a bind: its own hold must not count against it
            with self.cache.lock:
                self.cache.forget(uid)
            self.cache.remember(pod)
        self.preemption.catch_up_on_victims(uid)
        built = self.cache.ledgered()
        idx = self._indices(built, node_names)
        codes, texts = self.verdicts.judge(built, ask, idx)
        if ask.multi:
            codes = self._all_containers_fit(built, ask, idx, codes, texts)
        codes = self.preemption.reserved_for_others(pod, node_names, codes)
        ok = codes == 0
        chosen = -1
        if self.narrow and ok.any():
            chosen = self._choose(built, ask, idx, ok)
            if chosen < 0:  # the policy's own filter took every fitting node away
                codes = np.where(ok, CODE_EXCLUDED, codes)
                ok[:] = False
        names = np.fromiter(node_names, dtype=object, count=len(node_names))
        reason = np.array(texts, dtype=object)
        unresolvable = UNCURABLE[codes]
        failed = ~ok & ~unresolvable
        failed_map = dict(zip(names[failed].tolist(), reason[codes[failed]].tolist(), strict=True))
        passed = names[ok].tolist()
        if chosen >= 0:
            others = ok.copy()
            others[chosen] = False
            policy = ask.policy or self.cache.default_policy
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
        if ok.any():  # refused before, it waits no more for gpuslice
            self.cache.pending.pop(uid, None)
        if chosen >= 0:
            self._assume(pod, ask, node_names[chosen])
        if not ok.any() and node_names:
            counts = np.bincount(codes, minlength=len(texts))
            why = Counter({texts[c]: int(n) for c, n in enumerate(counts) if n})
            preempting = self.preemption.make_room(pod, built, ask, node_names, idx, codes)
            if preempting:
                why = Counter({preempting: len(node_names)})
            top = RefusalCode.PREEMPTING if preempting else code_of(int(np.argmax(counts[1:])) + 1)
            self.cache.explain(
                pod,
                len(node_names),
                why,
                "" if preempting else self._closest(built, ask, idx, codes),
                code=top.label if top is not None else "",
            )
        return result

    def _closest(self, built: LedgerBuild, ask: PodGpuRequest, idx: np.ndarray, codes: np.ndarray) -> str:
        """The offered node the pod came closest on, with the amounts (``Ledger.closest`` over the known
        nodes, the usable GPUs being ``open_slots``), for the FailedScheduling Event: "" for a MIG pod,
        whose instances are judged on the extender's candidates, for a pod of several slices (judged
        together, not by one request), or when no fit-rule check refused it."""
        known = idx >= 0
        if ask.mig_profile or ask.multi or not known.any():
            return ""
        rows = idx[known]
        usable = open_slots(built, rows, built.ledger.view.gpu_tasks[rows])
        closest = built.ledger.closest(ask.to_request(), codes[known], rows, usable)
        if closest is None or not closest.amounts:
            return ""
        return f"closest: {built.ledger.node_names[closest.node]} ({closest.amounts})"

    def _all_containers_fit(
        self, built: LedgerBuild, ask: PodGpuRequest, idx: np.ndarray, codes: np.ndarray, texts: list[str]
    ) -> np.ndarray:
        """For a pod where several app containers ask: of the nodes where the first container's slice
        fits, those where every container's does, together (``pod_slices.fits``, a what-if per node);
        the others get ``CODE_GPU`` with every container's ask in its text."""
        need = "; ".join(f"container {c.container!r}: {c.text()}" for c in ask.containers)
        texts[CODE_GPU] = f"{RefusalCode.INSUFFICIENT_GPU.value} for every container together ({need})"
        codes = codes.copy()
        with self.cache.lock:
            for k in np.flatnonzero(codes == 0):
                if not pod_slices.fits(self.cache, built, int(idx[k]), ask):
                    codes[k] = CODE_GPU
        return codes

    def _choose(self, built: LedgerBuild, ask: PodGpuRequest, idx: np.ndarray, ok: np.ndarray) -> int:
        """Position in ``idx`` of the node the policy chooses among the ``ok`` ones; -1 if its filter
        refuses them all. MIG: the node of the instance the one MIG choice takes among them all."""
        rows = idx[ok]
        positions = np.flatnonzero(ok)
        if ask.mig_profile:
            # The one MIG choice over these nodes takes the fullest GPU, the first in order on a tie: so
            # only the first node whose cached best is the fullest needs its candidates built.
            first = FullestByNode.first(rows, self.cache.mig_fullest(built, ask.mig_profile, rows))
            candidates = self.cache.mig_candidates(built, first, ask.mig_profile) if first is not None else []
            chosen = choose_mig_instance(candidates, fallbacks=self.cache.mig_fallbacks)
            if chosen is None:  # the verdicts said one fits: only a rebuild in between gets here
                return -1
            node = chosen[0].key[0]  # type: ignore[index]
            return int(positions[np.flatnonzero(rows == node)[0]])
        placer = self.cache.placer(built, ask)
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
        uid = pod_meta(pod)[2]
        if not uid:
            return
        now = time.monotonic()
        with self.cache.lock:
            if uid in self.cache.bound_to:  # bound already (a retry after a timed-out bind): keep it
                return
            for other in [u for u, t in self.cache.assumed.items() if now - t > ASSUMED_S]:
                del self.cache.assumed[other]
                self.cache.forget(other)
        with self.cache.node_lock(node):
            decision, _problem = self._reserve(uid, node, ask, pod)
        if decision is not None:
            with self.cache.lock:
                self.cache.assumed[uid] = now

    def _indices(self, built: LedgerBuild, node_names: list[str]) -> np.ndarray:
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
        self, pod: Mapping[str, Any], built: LedgerBuild, passed: list[str], idx: np.ndarray
    ) -> None:
        """The pod's /prioritize comes next with the nodes that passed: keep their indices for it."""
        _, _, uid = pod_meta(pod)
        with self.cache.lock:
            self._passed[uid] = (built, passed, idx)
            self._passed.move_to_end(uid)
            while len(self._passed) > NAME_LISTS_MAX:
                self._passed.popitem(last=False)

    def _prioritize_indices(
        self, pod: Mapping[str, Any], built: LedgerBuild, node_names: list[str]
    ) -> np.ndarray:
        """``_indices`` for /prioritize: usually exactly the nodes this pod's filter just passed."""
        kept = self._passed.get(pod_meta(pod)[2])
        if kept is not None and kept[0] is built and (kept[1] is node_names or kept[1] == node_names):
            return kept[2]
        return self._indices(built, node_names)

    # ---- prioritize ---------------------------------------------------------------------------------

    def prioritize(self, pod: Mapping[str, Any], node_names: list[str]) -> list[tuple[str, int]]:
        """(name, score 0..10) per node: the placement policy's score, min-max rescaled over the nodes."""
        return list(zip(node_names, self.scores(pod, node_names).tolist(), strict=True))

    def scores(self, pod: Mapping[str, Any], node_names: list[str]) -> np.ndarray:
        """``prioritize`` as an int array in the order of ``node_names``."""
        try:
            ask = pod_ask(pod)
        except InvalidRequest:
            return np.zeros(len(node_names), dtype=np.int64)
        if not ask.wants_gpu or not node_names:
            return np.zeros(len(node_names), dtype=np.int64)
        built = self.cache.ledgered()
        idx = self._prioritize_indices(pod, built, node_names)
        known = idx >= 0
        if ask.mig_profile:  # the one MIG choice's order: smallest profile, then the fullest GPU
            fullest = self.cache.mig_fullest(built, ask.mig_profile, np.where(known, idx, 0))
            raw = np.where(known & (fullest >= 0), fullest.astype(np.float64), -np.inf)
        else:
            placer = self.cache.placer(built, ask)
            req = ask.to_request()
            raw = np.full(len(idx), -np.inf)
            # the filter's verdicts
            fits = known & (self.verdicts.shape_codes(built, req, np.where(known, idx, 0)) == 0)
            if fits.any():
                candidates = idx[fits]
                # The placer's cached, fallback-guarded scoring (policy advises, the placer validates).
                raw[fits] = placer.node_scores(req, candidates)
        return _rescale(raw)

    # ---- bind ---------------------------------------------------------------------------------------

    def bind(self, namespace: str, name: str, uid: str, node: str, deadline: float | None = None) -> str:
        """Choose GPUs on ``node``, write the decision, create the Binding; '' or the error text.

        ``deadline`` (time.monotonic, default ``BIND_BUDGET_S`` from now; the HTTP app sets it when the
        request arrives): no wait, for another bind of the pod or for a locked node, goes past it. One
        bind per pod runs at a time, so a retry sees what the first one did: the check of ``_bound_to``
        and the reservation are never interleaved with another bind's of the same pod."""
        if deadline is None:
            deadline = time.monotonic() + BIND_BUDGET_S
        if not self.binds.claim(uid, deadline):
            return (
                f"pod {namespace}/{name}: another bind of this pod is still running; kube-scheduler retries"
            )
        try:
            return self._bind_claimed(namespace, name, uid, node, deadline)
        finally:
            self.binds.end(uid)

    def _bind_claimed(self, namespace: str, name: str, uid: str, node: str, deadline: float) -> str:
        pod = self.cache.seen.get(uid)
        try:
            if pod is None:
                pod = self.cache.api.get_pod(namespace, name)
            ask = pod_ask(pod)
        except InvalidRequest as err:
            return f"{REASON_INVALID}: {err}"
        except Exception as err:
            return f"cannot read pod {namespace}/{name}: {err}"
        with self.cache.lock:
            bound_to = self.cache.bound_to.get(uid)
        if bound_to is not None:  # kube-scheduler retrying a bind that timed out after it succeeded
            return "" if bound_to == node else f"pod {namespace}/{name} is already bound to {bound_to}"
        if not ask.wants_gpu or self.bind_locks is None:
            return self._bind(namespace, name, uid, node, pod, ask)
        problem = self.bind_locks.acquire(node, namespace, name, uid, ask_key(ask), deadline)
        if problem:
            return f"pod {namespace}/{name} on {node}: {problem}"
        error = "bind raised"
        try:
            error = self._bind(namespace, name, uid, node, pod, ask)
        finally:
            if error:  # not bound: nothing for the device plugin to release the lock after
                self.bind_locks.release(node, uid)
        return error

    def _bind(
        self, namespace: str, name: str, uid: str, node: str, pod: Mapping[str, Any], ask: PodGpuRequest
    ) -> str:
        decision: Decision | None = None
        if ask.wants_gpu:
            held = self.cache.nominations.get(node)
            if held is not None and held.uid != uid and held.priority >= pod_priority(pod):
                return f"pod {namespace}/{name} on {node}: {REASON_RESERVED}"
            with self.cache.lock:  # held since filter on this node: that hold is the decision (no re-pick,
                # whose release-then-reserve would let another pod's filter take the GPUs in between)
                assumed = self.cache.pods.get(uid) if self.cache.assumed.pop(uid, None) is not None else None
                if assumed is not None and assumed.node == node:
                    decision = assumed.decision
            if decision is None:
                with self.cache.node_lock(node):
                    decision, problem = self._reserve(uid, node, ask, pod)
                if decision is None:
                    return f"pod {namespace}/{name} on {node}: {problem}"
            with self.cache.lock:
                self.cache.drop_nomination(uid)
        try:
            if decision is not None:
                self.cache.api.patch_pod_annotations(namespace, name, decision.to_annotations())
            self.cache.api.create_binding(namespace, name, uid, node)
        except AlreadyBound as err:
            return self._bound_before(namespace, name, uid, node, err)
        except Exception as err:
            with self.cache.lock:
                self.cache.forget(uid)
            if decision is not None:
                try:
                    self.cache.api.patch_pod_annotations(
                        namespace, name, {ANNOTATION_BIND_PHASE: BIND_PHASE_FAILED}
                    )
                except Exception:
                    log.warning("could not mark %s/%s bind-phase failed", namespace, name, exc_info=True)
            return f"binding {namespace}/{name} to {node} failed: {err}"
        with self.cache.lock:
            self.cache.bound_to[uid] = node
        return ""

    def _bound_before(self, namespace: str, name: str, uid: str, node: str, err: AlreadyBound) -> str:
        """The API server had bound the pod before this Binding (an earlier bind whose answer was lost):
        the pod runs where that bind sent it, so nothing is given back while it may still be there and
        nothing is marked failed. Bound to this node: the decision just written is the one the device
        plugin reads, and its hold stays. Bound elsewhere: this node's hold goes; the pod's annotations
        now carry this bind's decision, for a node it is not on, and are left as they are: only a second
        scheduler binding the same pods gets here, and that case is not repaired. Unknown (the pod cannot
        be read): the hold stays, an over-count at worst."""
        try:
            winner = str((self.cache.api.get_pod(namespace, name).get("spec") or {}).get("nodeName") or "")
        except Exception:
            winner = ""
        with self.cache.lock:
            if winner == node:
                self.cache.bound_to[uid] = node
                return ""
            if winner:
                self.cache.forget(uid)
                self.cache.bound_to[uid] = winner
                return f"pod {namespace}/{name} is already bound to {winner}"
        return f"binding {namespace}/{name} to {node} refused: {err}"

    def _reserve(
        self, uid: str, node_name: str, ask: PodGpuRequest, pod: Mapping[str, Any]
    ) -> tuple[Decision | None, str]:
        """Under the node's lock: pick GPUs and hold them in the ledger (or a MIG instance)."""
        with self.cache.lock:
            if uid in self.cache.pods:  # a retried bind: give back what the earlier attempt held
                self.cache.forget(uid)
        built = self.cache.ledgered()
        node = built.index.get(node_name)
        if node is None:
            return None, REASON_NO_INVENTORY
        now = int(time.time())
        namespace, name, _ = pod_meta(pod)
        who = {"namespace": namespace, "name": name, "priority": pod_priority(pod)}
        with self.cache.lock:
            if not self.cache.is_current(built):  # rebuilt meanwhile: indices may have moved; retry
                return None, "the cluster's GPU inventory changed during bind; retry"
            held = pod_slices.hold(self.cache, built, node, ask)
            if isinstance(held, str):
                if ask.mig_profile and not ask.multi:
                    return None, f"{REASON_NO_MIG_INSTANCE} {ask.mig_profile} (taken since filter)"
                if held == pod_slices.NO_GPUS:  # one container: the verdict says why, in its words
                    codes, texts = self.verdicts.judge(built, ask, np.array([node]))
                    return None, f"no longer fits: {texts[int(codes[0])] or held}"
                return None, f"no longer fits: {held}" if held.endswith(pod_slices.NO_GPUS) else held
            first = held.slices[0]
            # the kubelet's allocation order: init containers, then app containers (each in spec order)
            inside = pod_slices.inside(ask, first)
            slices = (*held.slices, *inside) if ask.is_init else (*inside, *held.slices)
            decision = Decision(
                node_name, first.container, first.gpu_indices, first.gpu_uuids, first.memory_mib,
                first.cores_percent, first.mig, bind_time=now, containers=slices if ask.multi else (),
            )  # fmt: skip
            self.cache.pods[uid] = BoundPod(
                node_name, ask, decision, placement=held.placements[0], extra=held.placements[1:], **who
            )
            return decision, ""

    # ---- checks -------------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """The ledger's own invariants (MIG instances included) plus: no GPU holds more shares than its
        splitCount, and every cached verdict that its version says is current equals one computed
        afresh."""
        built = self.cache.ledgered()
        with self.cache.lock:
            built.ledger.check_invariants()
            tasks = built.ledger.view.gpu_tasks
            over = built.healthy & (tasks > built.split[:, None])
            if over.any():
                raise AssertionError(f"GPUs over their share limit: {np.argwhere(over).tolist()}")
            for req, cache in built.verdicts.items():
                current = np.flatnonzero(cache.version == built.ledger.view.version)
                stale = current[cache.codes[current] != self.verdicts.row_codes(built, req, current)]
                if len(stale):
                    raise AssertionError(f"outdated verdicts cached for {req}: nodes {stale.tolist()}")


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
