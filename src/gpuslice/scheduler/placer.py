"""The placement mechanism: runs a policy's hooks, validates its advice, and reserves in the ledger.

The policy advises, the placer decides (DESIGN.md). A hook that raises, returns the wrong shape, NaN,
or GPUs the ledger refuses costs quality, never correctness: the placer falls back to the default
(equal scores, ``default_gpus``) and counts the fallback in ``fallbacks[(hook, reason)]``. Every hook
goes through the one fallback rule of every policy family (``advice.ask``, via ``Placer._ask``).

Every home decides here: ``gpuslice sim`` calls ``place``; ``gpuslice serve`` (one node) and the
Kubernetes extender (a node kube-scheduler is asking about) call ``pick_gpus`` for the GPUs inside a
node, with the GPUs they may not use masked out (unhealthy, in MIG mode, a model the job excludes, a
share count used up) and the node's wiring for multi-GPU sets.

A MIG request (``Request.mig_profile``) is not the placement policy's: ``place`` hands it to the one
MIG choice (``scheduler/mig_choice.py``) over every MIG GPU of the nodes the fit rule lets it use (model,
a free start for its profile, CPU, memory), with the MIG placement policy's start, and holds the
instance with ``Ledger.reserve_mig``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from gpuslice.advice import Fallback, ask
from gpuslice.hardware.topology import Topology
from gpuslice.ledger.ledger import Ledger, LedgerView
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode
from gpuslice.policies.base import PlacementOps, TieBreak, best_fit_gpus
from gpuslice.policies.gpuset.batch import BatchJob, first_of_batch
from gpuslice.policies.gpuset.pick import meets_need, pick_gpu_set
from gpuslice.policies.mig_placement import MigPlacementOps
from gpuslice.scheduler.mig_choice import (
    FullestByNode,
    MigCandidate,
    choose_mig_instance,
    created_candidates,
)
from gpuslice.workload.job import TopologyNeed
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = ["Placer", "Unplaced", "default_gpus", "wants_gpu_set"]

T = TypeVar("T")


@dataclass(frozen=True)
class Unplaced:
    """No node can take the request now; ``reasons`` counts each node's first failing check, ``closest``
    is the node it came closest on with the amounts (``Ledger.closest``), named ``closest_node``."""

    request: Request
    node_count: int
    reasons: Counter[RefusalCode] = field(default_factory=Counter)
    # Why no node was judged at all, or what ruled out the nodes besides the fit rule (a home's own
    # constraint: the DRA claim's node selector or matchAttribute); said after the counts.
    note: str = ""
    closest: Refusal | None = None
    closest_node: str = ""

    @classmethod
    def explained(cls, req: Request, ledger: Ledger, note: str = "") -> Unplaced:
        """Every node's first failing check counted, and the closest node with its amounts."""
        codes = ledger.refusal_codes(req)
        closest = ledger.closest(req, codes)
        name = "" if closest is None else ledger.node_names[closest.node]
        return cls(req, ledger.node_count, ledger.why_not(req, codes), note, closest, name)

    def __str__(self) -> str:
        detail = ", ".join(f"{n} {code.value}" for code, n in self.reasons.most_common())
        text = f"0/{self.node_count} nodes fit" + (f": {detail}" if detail else "")
        if self.closest is not None and self.closest.amounts:
            text += f"; closest: {self.closest_node} ({self.closest.amounts})"
        return f"{text}: {self.note}" if self.note else text


class _ScoreCache:
    """Per request shape: the last score of every node and the node version it was computed at."""

    def __init__(self, node_count: int) -> None:
        self.scores = np.zeros(node_count)
        self.version = np.full(node_count, -1, dtype=np.int64)


class Placer:
    """Places requests on a ledger with one placement policy."""

    def __init__(
        self,
        ledger: Ledger,
        policy: PlacementOps,
        rng: np.random.Generator | None = None,
        topologies: list[Topology | None] | None = None,
        mig_policy: MigPlacementOps | None = None,
    ) -> None:
        """``topologies`` (one per ledger node, None where unknown) lets the default GPU choice for several
        whole GPUs follow the wiring; without it the lowest free GPUs are taken. ``mig_policy``: where a
        MIG instance starts on its GPU (None: the MIG family's default)."""
        self.ledger = ledger
        self.policy = policy
        self.mig_policy = mig_policy
        self._mig_fullest = FullestByNode(ledger.node_count)
        self.topologies = topologies
        self.rng = rng if rng is not None else policy.context.rng
        self.fallbacks: Counter[tuple[str, str]] = Counter()
        self._cache: dict[Request, _ScoreCache] = {}

    def feasible(self, req: Request) -> np.ndarray:
        """Nodes that can take ``req``: the ledger's fit mask, narrowed by the policy's filter."""
        mask = self.ledger.fits(req)
        extra = self._ask(
            "filter",
            lambda: self.policy.filter(self.ledger.view, req),
            lambda m: m is None or getattr(m, "shape", None) == mask.shape or Fallback.WRONG_SHAPE,
            lambda: None,
        )
        return mask if extra is None else mask & extra.astype(bool)

    def node_scores(self, req: Request, candidates: np.ndarray) -> np.ndarray:
        """The policy's scores of ``candidates`` (feasible node indices), normalized over them together,
        with broken answers replaced and counted: what ``choose_node`` ranks by."""
        return self._normalized(req, self._scores(req, candidates))

    def choose_node(self, req: Request, feasible: np.ndarray) -> int:
        """The best feasible node by the policy's scores and tie rule; ``feasible`` must have a node."""
        candidates = np.flatnonzero(feasible)
        scores = self.node_scores(req, candidates)
        best = np.flatnonzero(scores == scores.max())
        if len(best) == 1 or self.policy.tie_break is TieBreak.FIRST:
            return int(candidates[best[0]])
        return int(candidates[best[self.rng.integers(len(best))]])

    def place(
        self, req: Request, explain: bool = True, later: Sequence[Request] = ()
    ) -> Placement | Unplaced:
        """Reserve ``req`` where the policy advises; Unplaced (ledger unchanged) if nowhere fits.

        ``explain=False`` skips counting each node's reason in the Unplaced (a replay drops failed
        pods without reading why, and the count costs a pass over every node). ``later``: requests
        waiting after this one (the replay's pods that arrived with it); where the chosen node's wiring
        is known, a multi-GPU request gets the set their joint assignment gives it
        (``first_of_batch``) in the default's place. A MIG request goes to the one MIG choice (module
        docstring)."""
        if req.mig_profile:
            return self._place_mig(req, explain)
        feasible = self.feasible(req)
        if not feasible.any():
            if not explain:
                return Unplaced(req, self.ledger.node_count)
            unplaced = Unplaced.explained(req, self.ledger)
            fitting = self.ledger.node_count - sum(unplaced.reasons.values())
            if fitting:  # the ledger had room; the policy's filter took those nodes away
                unplaced.reasons[RefusalCode.EXCLUDED_BY_POLICY] = fitting
            return unplaced
        node = self.choose_node(req, feasible)
        result = self._reserve_with_advice(req, node, later)
        if isinstance(result, Refusal):  # the ledger said the node fits, so only a broken ledger gets here
            return Unplaced(req, self.ledger.node_count, Counter({result.code: 1}))
        self._notify("on_placed", result)
        return result

    def _place_mig(self, req: Request, explain: bool) -> Placement | Unplaced:
        """The MIG instance ``choose_mig_instance`` takes among the MIG GPUs of every node the fit rule
        lets it use (model, a free start for the profile, CPU, memory), held by ``Ledger.reserve_mig``.
        Unplaced: each node's first failing check (``Ledger.why_not``)."""
        view, profile = self.ledger.view, req.mig_profile
        rows = np.flatnonzero(self.ledger.fits(req))

        def candidates_of(node: int) -> list[MigCandidate]:
            return created_candidates(view, ((node, g) for g in view.mig_gpus_on(node)), profile)

        held = self._mig_fullest.fullest(profile, rows, view.version, candidates_of)
        first = FullestByNode.first(rows, held)  # the node the one choice takes; its GPUs decide
        why: Counter[str] = Counter()
        candidates = candidates_of(first) if first is not None else []
        chosen = choose_mig_instance(candidates, self.mig_policy, why)
        for key, n in why.items():  # "mig-placement: <reason>", as the other homes count it
            hook, _, reason = key.partition(": ")
            self.fallbacks[(hook, reason)] += n
        if chosen is None:
            return Unplaced.explained(req, self.ledger) if explain else Unplaced(req, self.ledger.node_count)
        (node, gpu), instance = chosen[0].key, chosen[1]  # type: ignore[misc]
        result = self.ledger.reserve_mig(node, gpu, instance, req)
        if isinstance(result, Refusal):  # the layout said it is free, so only a broken ledger gets here
            return Unplaced(req, self.ledger.node_count, Counter({result.code: 1}))
        self._notify("on_placed", result)
        return result

    def pick_gpus(
        self,
        req: Request,
        node: int,
        usable: np.ndarray | None = None,
        topology: Topology | None = None,
        need: TopologyNeed = TopologyNeed.ANY,
        batch: tuple[int, ...] | None = None,
    ) -> tuple[int, ...] | None:
        """The GPUs of ``node`` for ``req``: the policy's advice when the ledger, ``usable`` (bool per GPU
        slot) and ``need`` accept it, else ``default_gpus``; None when no choice exists. Reserves nothing.
        ``batch``: the set a joint assignment of several waiting jobs gave this one (policies/gpuset/
        batch.py); it takes the default's place, under the same checks as advice."""
        view = self.ledger.view
        allowed = view.gpu_fits(req, node)
        if usable is not None:
            allowed = allowed & usable

        def refusal_of(gpus: tuple[int, ...]) -> Fallback | None:
            refusal = self.ledger.check(node, gpus, req)
            if refusal is not None:  # a GPU that is not there, or twice, or not allowed; or one too full
                return Fallback.DOES_NOT_FIT if refusal.code.curable else Fallback.GPU_NOT_USABLE
            if len(gpus) != req.num_gpu or not all(0 <= g < len(allowed) and allowed[g] for g in gpus):
                return Fallback.GPU_NOT_USABLE
            return None if meets_need(topology, gpus, need) else Fallback.TOPOLOGY_NEED_NOT_MET

        def check(advice: tuple[int, ...] | None) -> bool | Fallback:
            if advice is None:  # "the mechanism's default", not a fallback
                return True
            if not all(isinstance(g, int | np.integer) and not isinstance(g, bool) for g in advice):
                return Fallback.NOT_GPU_INDICES
            return refusal_of(tuple(int(g) for g in advice)) or True

        def hook() -> tuple[int, ...] | None:
            answer = self.policy.pick_gpus(view, req, node)
            return None if answer is None else tuple(answer)

        advice = self._ask("pick_gpus", hook, check, lambda: None)
        if advice is not None:
            return tuple(int(g) for g in advice)
        if batch is not None:  # the joint assignment's set, under the same checks, counted the same way
            refusal = refusal_of(batch)
            if refusal is None:
                return batch
            self.fallbacks[("batch", refusal)] += 1
        return default_gpus(view, req, node, allowed, topology, need)

    def release(self, placement: Placement) -> None:
        self.ledger.release(placement)
        self._notify("on_released", placement)

    def _notify(self, hook: str, placement: Placement) -> None:
        """Tell the policy; its failure is counted and never undoes what the ledger already did."""
        self._ask(hook, lambda: getattr(self.policy, hook)(self.ledger.view, placement), _any, _none)

    def _ask(
        self,
        hook: str,
        call: Callable[[], T],
        check: Callable[[T], bool | Fallback],
        default: Callable[[], T],
        repair: Callable[[T], T] | None = None,
    ) -> T:
        """One hook through the one fallback rule (``advice.ask``), a fallback counted as
        ``fallbacks[(hook, reason)]`` (the reasons the metrics and ``sim`` results report)."""
        advice = ask(call, check, default, repair)
        if advice.fallback is not None:
            self.fallbacks[(hook, advice.fallback)] += 1
        return advice.value

    def _normalized(self, req: Request, scores: np.ndarray) -> np.ndarray:
        """The policy's normalize over all candidates; raw scores if it fails or returns junk."""
        return self._ask(
            "normalize",
            lambda: np.asarray(self.policy.normalize(self.ledger.view, req, scores), dtype=np.float64),
            lambda out: _array_check(out, scores.shape),
            lambda: self._usable(scores),
        )

    @staticmethod
    def _usable(scores: np.ndarray) -> np.ndarray:
        """Scores with a maximum: NaN (from a broken score hook) becomes −inf, all-NaN becomes all equal."""
        scores = np.nan_to_num(scores, nan=-np.inf)
        return np.zeros_like(scores) if np.isneginf(scores).all() else scores

    def _scores(self, req: Request, candidates: np.ndarray) -> np.ndarray:
        if not self.policy.memory_in_score:
            req = req.without_memory()
        cache = self._cache.get(req)
        if cache is None:
            cache = self._cache[req] = _ScoreCache(self.ledger.node_count)
        version = self.ledger.view.version
        stale = candidates[cache.version[candidates] != version[candidates]]
        if len(stale):
            cache.scores[stale] = self._policy_scores(req, stale)
            cache.version[stale] = version[stale]
        return cache.scores[candidates]

    def _policy_scores(self, req: Request, nodes: np.ndarray) -> np.ndarray:
        shape = (len(nodes),)
        return self._ask(
            "score",
            lambda: np.asarray(self.policy.score(self.ledger.view, req, nodes), dtype=np.float64),
            lambda scores: _array_check(scores, shape),
            lambda: np.zeros(shape),
            # NaN nodes rank below every real score; a wrong shape has nothing to keep
            repair=lambda scores: self._usable(scores) if scores.shape == shape else np.zeros(shape),
        )

    def _reserve_with_advice(
        self, req: Request, node: int, later: Sequence[Request] = ()
    ) -> Placement | Refusal:
        """Reserve on ``node`` the GPUs ``pick_gpus`` chooses (sim has no usable mask and no need)."""
        topology = self.topologies[node] if self.topologies is not None else None
        batch = self._batch(req, node, topology, later) if later and topology is not None else None
        return self.ledger.reserve(node, self.pick_gpus(req, node, topology=topology, batch=batch) or (), req)

    def _batch(
        self, req: Request, node: int, topology: Topology, later: Sequence[Request]
    ) -> tuple[int, ...] | None:
        """The joint assignment's set for ``req`` on ``node`` beside the later multi-GPU requests."""
        if not wants_gpu_set(req):
            return None
        view = self.ledger.view
        whole = view.free_gpu_milli[node, : topology.n_gpus] >= MILLI_PER_GPU
        free = [int(g) for g in np.flatnonzero(whole & view.gpu_fits(req, node)[: topology.n_gpus])]
        others = [BatchJob("", r.num_gpu) for r in later if wants_gpu_set(r)]
        return first_of_batch(topology, free, BatchJob("", req.num_gpu), others)


def wants_gpu_set(req: Request) -> bool:
    """Two or more whole GPUs: the only requests a joint GPU-set assignment is for."""
    return req.num_gpu >= 2 and req.gpu_milli >= MILLI_PER_GPU


def _array_check(values: np.ndarray, shape: tuple[int, ...]) -> bool | Fallback:
    if values.shape != shape:
        return Fallback.WRONG_SHAPE
    return not np.isnan(values).any() or Fallback.NAN


def _any(_: object) -> bool:
    return True


def _none() -> None:
    return None


def default_gpus(
    view: LedgerView,
    req: Request,
    node: int,
    allowed: np.ndarray,
    topology: Topology | None = None,
    need: TopologyNeed = TopologyNeed.ANY,
) -> tuple[int, ...] | None:
    """The one fallback rule, for every home and every policy: best fit for a share of one GPU (and for
    one whole GPU), the GPU-set choice (``pick_gpu_set``: topology, NVLink, ``need``) for several whole
    GPUs. ``allowed`` (bool per GPU slot): the GPUs with room for ``req`` that it may use. None when
    none of them will do."""
    if req.num_gpu == 0:
        return ()
    if req.num_gpu == 1:  # a share, or one whole GPU: no set to choose, no need to meet
        return best_fit_gpus(view, req, node, allowed) or None
    return pick_gpu_set(topology, np.flatnonzero(allowed).tolist(), req.num_gpu, need=need)
