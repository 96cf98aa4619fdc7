"""scheduler.placer: the mechanism validates policy advice, falls back, and counts the fallbacks.

Cluster (conftest): 0 v100-a 4×V100, 1 v100-b 4×V100, 2 t4-c 2×T4, 3 cpu-d no GPU.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger.ledger import Ledger, LedgerView
from gpuslice.ledger.placement import Placement
from gpuslice.policies import PlacementOps, PolicyContext, TieBreak
from gpuslice.scheduler.placer import Placer, Unplaced
from gpuslice.units import GiB
from gpuslice.workload.request import Request

SHARE = Request(cpu_milli=1000, num_gpu=1, gpu_milli=100)
WHOLE = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000)
TWO = Request(cpu_milli=1000, num_gpu=2, gpu_milli=1000)
CPU_ONLY = Request(cpu_milli=1000)


def placer_for(ledger: Ledger, policy_cls: type[PlacementOps], seed: int = 0) -> Placer:
    return Placer(ledger, policy_cls(ledger.view, PolicyContext(rng=np.random.default_rng(seed))))


# ---- bogus policies: each must cost quality, never correctness ---------------------------------------


class RaisesInScore(PlacementOps):
    name = "raises-in-score"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        raise RuntimeError("boom")


class WrongShapeScore(PlacementOps):
    name = "wrong-shape-score"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        return np.zeros(len(nodes) + 1)


class NanScore(PlacementOps):
    name = "nan-score"

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        return np.full(len(nodes), np.nan)


class ImpossibleGpu(PlacementOps):
    name = "impossible-gpu"

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
        return (7,) * req.num_gpu  # no node here has a GPU 7


class RaisesInPickGpus(PlacementOps):
    name = "raises-in-pick-gpus"

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
        raise KeyError("boom")


class RaisesInFilter(PlacementOps):
    name = "raises-in-filter"

    def filter(self, view: LedgerView, req: Request) -> np.ndarray | None:
        raise ZeroDivisionError


class WrongShapeFilter(PlacementOps):
    name = "wrong-shape-filter"

    def filter(self, view: LedgerView, req: Request) -> np.ndarray | None:
        return np.ones(view.node_count + 2, dtype=bool)


BOGUS = [
    pytest.param(RaisesInScore, ("score", "exception"), id="score raises"),
    pytest.param(WrongShapeScore, ("score", "wrong shape"), id="score has the wrong shape"),
    pytest.param(NanScore, ("score", "nan"), id="score is NaN"),
    pytest.param(
        ImpossibleGpu, ("pick_gpus", "GPU not usable"), id="pick_gpus advises a GPU that is not there"
    ),
    pytest.param(RaisesInPickGpus, ("pick_gpus", "exception"), id="pick_gpus raises"),
    pytest.param(RaisesInFilter, ("filter", "exception"), id="filter raises"),
    pytest.param(WrongShapeFilter, ("filter", "wrong shape"), id="filter has the wrong shape"),
]


@pytest.mark.parametrize(("policy_cls", "key"), BOGUS)
def test_a_broken_policy_still_places_validly_and_the_fallback_is_counted(
    ledger: Ledger, policy_cls: type[PlacementOps], key: tuple[str, str]
) -> None:
    placer = placer_for(ledger, policy_cls)
    for _ in range(3):
        result = placer.place(SHARE)  # a small share: the chosen node stays feasible, so it is re-scored
        assert isinstance(result, Placement)
        assert ledger.check(result.node, (), CPU_ONLY) is None
        ledger.check_invariants()
    assert placer.fallbacks == Counter({key: 3})


def test_refused_gpu_advice_falls_back_to_best_fit_gpus(ledger: Ledger) -> None:
    placer = placer_for(ledger, ImpossibleGpu)
    assert isinstance(ledger.reserve(0, (2,), Request(cpu_milli=0, num_gpu=1, gpu_milli=600)), Placement)
    result = placer.place(Request(cpu_milli=1000, num_gpu=1, gpu_milli=400))
    assert isinstance(result, Placement)
    assert (result.node, result.gpus) == (0, (2,))  # the fitting GPU with least free


def test_nan_scored_nodes_rank_below_every_real_score(ledger: Ledger) -> None:
    class NanOnFirst(PlacementOps):
        name = "nan-on-first"

        def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
            return np.where(nodes == 0, np.nan, 0.0)

    placer = placer_for(ledger, NanOnFirst)
    result = placer.place(SHARE)
    assert isinstance(result, Placement)
    assert result.node == 1
    assert placer.fallbacks == Counter({("score", "nan"): 1})


def test_a_policy_filter_narrows_but_never_widens_the_ledgers_mask(ledger: Ledger) -> None:
    class AllowsEverything(PlacementOps):
        name = "allows-everything"

        def filter(self, view: LedgerView, req: Request) -> np.ndarray | None:
            return np.ones(view.node_count, dtype=bool)

    class OnlyNode2(PlacementOps):
        name = "only-node-2"

        def filter(self, view: LedgerView, req: Request) -> np.ndarray | None:
            return np.arange(view.node_count) == 2

    assert isinstance(placer_for(ledger, AllowsEverything).place(Request(cpu_milli=64_000)), Unplaced)
    result = placer_for(ledger, OnlyNode2).place(SHARE)
    assert isinstance(result, Placement)
    assert result.node == 2


# ---- the minimal policy ------------------------------------------------------------------------------


class OnlyAName(PlacementOps):
    name = "only-a-name"


def test_a_policy_with_only_a_name_places_jobs_on_the_defaults(ledger: Ledger) -> None:
    placer = placer_for(ledger, OnlyAName)
    assert isinstance(ledger.reserve(1, (3,), Request(cpu_milli=0, num_gpu=1, gpu_milli=500)), Placement)
    placed = [placer.place(req) for req in (SHARE, TWO, CPU_ONLY, Request(cpu_milli=1000, gpu_models=()))]
    assert all(isinstance(p, Placement) for p in placed)
    assert [(p.node, p.gpus) for p in placed] == [(0, (0,)), (0, (1, 2)), (0, ()), (0, ())]
    share_on_used = placer.place(Request(cpu_milli=0, num_gpu=1, gpu_milli=400, gpu_models=("V100M16",)))
    assert isinstance(share_on_used, Placement)
    assert (share_on_used.node, share_on_used.gpus) == (0, (0,))  # best fit: GPU 0 has 900 free
    assert placer.fallbacks == Counter()
    ledger.check_invariants()


# ---- Unplaced ----------------------------------------------------------------------------------------


def test_unplaced_reads_like_kube_schedulers_fit_error() -> None:
    ledger = Ledger([NodeSpec(f"n{i}", 8000, 16 * GiB, 2, "T4") for i in range(2)])
    before = ledger.view.free_gpu_milli.copy()
    result = placer_for(ledger, OnlyAName).place(Request(cpu_milli=1000, num_gpu=3, gpu_milli=1000))
    assert isinstance(result, Unplaced)
    assert str(result) == "0/2 nodes fit: 2 insufficient free GPU; closest: n0 (need 3, free 2 of 2 GPUs)"
    np.testing.assert_array_equal(ledger.view.free_gpu_milli, before)


def test_unplaced_lists_the_most_common_reason_first(ledger: Ledger) -> None:
    assert isinstance(ledger.reserve(0, (0,), WHOLE), Placement)
    assert isinstance(ledger.reserve(1, (), Request(cpu_milli=20_000)), Placement)
    req = Request(cpu_milli=16_000, num_gpu=4, gpu_milli=1000, gpu_models=("V100M16",))
    result = placer_for(ledger, OnlyAName).place(req)
    assert isinstance(result, Unplaced)
    assert (
        str(result) == "0/4 nodes fit: 2 GPU model not allowed, 1 insufficient free GPU, 1 insufficient CPU"
    )


# ---- ties --------------------------------------------------------------------------------------------


def test_tie_break_first_picks_the_lowest_index_among_equal_best_scores(ledger: Ledger) -> None:
    class BestAfterZero(PlacementOps):
        name = "best-after-zero"

        def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
            return np.where(nodes >= 1, 5.0, 0.0)

    assert BestAfterZero.tie_break is TieBreak.FIRST
    placer = placer_for(ledger, BestAfterZero)
    assert placer.choose_node(SHARE, np.array([True, True, True, False])) == 1
    assert placer.choose_node(SHARE, np.array([True, False, True, False])) == 2
    assert placer.choose_node(SHARE, np.array([True, False, False, False])) == 0


def test_tie_break_random_draws_among_the_best_only(ledger: Ledger) -> None:
    class RandomAmongOneAndTwo(PlacementOps):
        name = "random-among-1-and-2"
        tie_break = TieBreak.RANDOM

        def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
            return np.where((nodes == 1) | (nodes == 2), 1.0, 0.0)

    feasible = np.array([True, True, True, False])
    chosen = {
        placer_for(ledger, RandomAmongOneAndTwo, seed).choose_node(SHARE, feasible) for seed in range(20)
    }
    assert chosen == {1, 2}


# ---- the score cache ---------------------------------------------------------------------------------


class Spy(PlacementOps):
    name = "spy"

    def __init__(self, view: LedgerView, context: PolicyContext) -> None:
        super().__init__(view, context)
        self.scored: list[tuple[Request, list[int]]] = []
        self.events: list[tuple[str, int]] = []

    def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
        self.scored.append((req, nodes.tolist()))
        return np.zeros(len(nodes))

    def on_placed(self, view: LedgerView, placement: Placement) -> None:
        self.events.append(("placed", placement.id))

    def on_released(self, view: LedgerView, placement: Placement) -> None:
        self.events.append(("released", placement.id))


def test_after_a_reservation_only_the_changed_node_is_rescored(ledger: Ledger) -> None:
    placer = placer_for(ledger, Spy)
    spy = placer.policy
    assert isinstance(spy, Spy)
    first = placer.place(SHARE)
    assert isinstance(first, Placement) and first.node == 0
    assert spy.scored == [(SHARE, [0, 1, 2])]
    placer.place(Request(cpu_milli=1000, num_gpu=1, gpu_milli=100))  # equal request: same cache entry
    assert spy.scored[-1] == (SHARE, [0])
    placer.place(WHOLE)  # a new shape is scored everywhere once
    assert spy.scored[-1] == (WHOLE, [0, 1, 2])
    placer.release(first)
    placer.place(SHARE)
    assert spy.scored[-1] == (SHARE, [0])
    assert len(spy.scored) == 4


def test_a_reservation_elsewhere_does_not_rescore_an_untouched_node(ledger: Ledger) -> None:
    placer = placer_for(ledger, Spy)
    spy = placer.policy
    assert isinstance(spy, Spy)
    placer.place(SHARE)
    assert isinstance(ledger.reserve(2, (0,), SHARE), Placement)  # changes node 2 behind the placer's back
    placer.place(SHARE)
    assert spy.scored[-1] == (SHARE, [0, 2])


def test_the_placer_tells_the_policy_about_each_placement_and_release(ledger: Ledger) -> None:
    placer = placer_for(ledger, Spy)
    spy = placer.policy
    assert isinstance(spy, Spy)
    placement = placer.place(SHARE)
    assert isinstance(placement, Placement)
    assert isinstance(placer.place(Request(cpu_milli=99_000)), Unplaced)
    placer.release(placement)
    assert spy.events == [("placed", placement.id), ("released", placement.id)]


def test_the_placer_draws_from_the_policys_generator_unless_given_one(ledger: Ledger) -> None:
    policy = OnlyAName(ledger.view, PolicyContext(rng=np.random.default_rng(0)))
    assert Placer(ledger, policy).rng is policy.context.rng
    own = np.random.default_rng(1)
    assert Placer(ledger, policy, rng=own).rng is own


def test_unplaced_counts_the_nodes_the_policy_filter_removed(ledger: Ledger) -> None:
    class ExcludesAll(PlacementOps):
        name = "excludes-all"

        def filter(self, view: LedgerView, req: Request) -> np.ndarray | None:
            return np.zeros(view.node_count, dtype=bool)

    result = placer_for(ledger, ExcludesAll).place(SHARE)
    assert isinstance(result, Unplaced)
    assert str(result) == "0/4 nodes fit: 3 excluded by the placement policy, 1 GPU model not allowed"


def test_unplaced_without_explanation_skips_counting_reasons(ledger: Ledger) -> None:
    result = placer_for(ledger, OnlyAName).place(Request(cpu_milli=99_000), explain=False)
    assert isinstance(result, Unplaced)
    assert result.reasons == Counter()
    assert str(result) == "0/4 nodes fit"


def test_requests_differing_only_in_memory_share_scores_when_the_policy_ignores_memory(
    ledger: Ledger,
) -> None:
    class MemoryBlindSpy(Spy):
        name = "memory-blind-spy"
        memory_in_score = False

    placer = placer_for(ledger, MemoryBlindSpy)
    spy = placer.policy
    assert isinstance(spy, Spy)
    placer.place(SHARE)
    placer.place(Request(cpu_milli=1000, memory_bytes=GiB, num_gpu=1, gpu_milli=100))
    assert spy.scored == [(SHARE, [0, 1, 2]), (SHARE, [0])]  # the policy sees the memory-free shape


def test_requests_differing_in_memory_are_scored_apart_when_the_policy_reads_memory(ledger: Ledger) -> None:
    placer = placer_for(ledger, Spy)
    spy = placer.policy
    assert isinstance(spy, Spy)
    with_memory = Request(cpu_milli=1000, memory_bytes=GiB, num_gpu=1, gpu_milli=100)
    placer.place(SHARE)
    placer.place(with_memory)
    assert spy.scored == [(SHARE, [0, 1, 2]), (with_memory, [0, 1, 2])]


# ---- hooks whose failure must not escape the placer -------------------------------------------------


def test_a_normalize_that_raises_falls_back_and_is_counted(ledger: Ledger) -> None:
    class RaisesInNormalize(PlacementOps):
        name = "raises-in-normalize"

        def normalize(self, view: LedgerView, req: Request, scores: np.ndarray) -> np.ndarray:
            raise RuntimeError("boom")

    placer = placer_for(ledger, RaisesInNormalize)
    assert isinstance(placer.place(SHARE), Placement)
    assert any(hook == "normalize" for hook, _ in placer.fallbacks)


def test_a_normalize_that_returns_nan_falls_back_and_is_counted(ledger: Ledger) -> None:
    class NanNormalize(PlacementOps):
        name = "nan-normalize"

        def normalize(self, view: LedgerView, req: Request, scores: np.ndarray) -> np.ndarray:
            return np.full(len(scores), np.nan)

    placer = placer_for(ledger, NanNormalize)
    assert isinstance(placer.place(SHARE), Placement)
    assert any(hook == "normalize" for hook, _ in placer.fallbacks)


@pytest.mark.parametrize("advice", [(None,), ("a",)], ids=["None", "a string"])
def test_gpu_advice_that_is_not_integers_falls_back_and_is_counted(ledger: Ledger, advice: tuple) -> None:
    class JunkGpus(PlacementOps):
        name = "junk-gpus"

        def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
            return advice

    placer = placer_for(ledger, JunkGpus)
    assert isinstance(placer.place(SHARE), Placement)
    assert any(hook == "pick_gpus" for hook, _ in placer.fallbacks)


def test_an_on_placed_that_raises_does_not_lose_the_placement(ledger: Ledger) -> None:
    class RaisesOnPlaced(PlacementOps):
        name = "raises-on-placed"

        def on_placed(self, view: LedgerView, placement: Placement) -> None:
            raise RuntimeError("boom")

    placer = placer_for(ledger, RaisesOnPlaced)
    result = placer.place(SHARE)
    assert isinstance(result, Placement)
    assert ledger.live_placements == (result,)


# ---- pick_gpus: the GPUs inside one node, for serve and the extender ---------------------------------


class AdvisesGpu3(PlacementOps):
    name = "advises-gpu-3"

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
        return (3,)


def test_pick_gpus_takes_usable_advice_and_reserves_nothing(ledger: Ledger) -> None:
    placer = placer_for(ledger, AdvisesGpu3)
    assert placer.pick_gpus(SHARE, 0) == (3,)
    assert ledger.live_placements == ()
    assert placer.fallbacks == Counter()


def test_pick_gpus_replaces_advice_naming_an_unusable_gpu_and_counts_it(ledger: Ledger) -> None:
    placer = placer_for(ledger, AdvisesGpu3)
    usable = np.ones(ledger.view.free_gpu_milli.shape[1], dtype=bool)
    usable[3] = False
    usable[0] = False
    assert placer.pick_gpus(SHARE, 0, usable=usable) == (1,)
    assert placer.fallbacks == Counter({("pick_gpus", "GPU not usable"): 1})


def test_pick_gpus_default_best_fit_goes_by_free_memory_when_the_request_names_memory(ledger: Ledger) -> None:
    placer = placer_for(ledger, PlacementOps)
    ledger.reserve(0, (1,), Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=10 * GiB))
    ledger.reserve(0, (2,), Request(cpu_milli=0, num_gpu=1, gpu_milli=600))
    by_memory = Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=GiB)
    by_compute = Request(cpu_milli=0, num_gpu=1, gpu_milli=100)
    assert placer.pick_gpus(by_memory, 0) == (1,)  # least free memory
    assert placer.pick_gpus(by_compute, 0) == (2,)  # least free milli-GPU


def test_pick_gpus_for_several_whole_gpus_follows_the_wiring_and_the_need() -> None:
    from gpuslice.hardware.topology_profiles import profile
    from gpuslice.policies.gpuset.pick import pick_gpu_set
    from gpuslice.workload.job import TopologyNeed

    topo = profile("dgx1-v100")
    ledger = Ledger([NodeSpec("dgx", 96_000, 512 * GiB, 8, "V100", 32 * GiB)])
    placer = placer_for(ledger, PlacementOps)
    ledger.reserve(0, (0, 2), TWO)
    free = [1, 3, 4, 5, 6, 7]
    four = Request(cpu_milli=0, num_gpu=4, gpu_milli=1000)
    assert placer.pick_gpus(four, 0, topology=topo) == pick_gpu_set(topo, free, 4)
    pcie = profile("pcie-8gpu-2socket")
    assert placer.pick_gpus(TWO, 0, topology=pcie, need=TopologyNeed.NVLINK) is None
