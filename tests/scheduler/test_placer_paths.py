"""scheduler.placer's less travelled paths: the joint GPU-set assignment in ``place``, the MIG path's
policy, fallbacks and cache, a ledger that refuses after its fit rule said yes, the Unplaced record, and
the reasons a GPU advice or a filter is refused for.

Cluster (conftest ``ledger``): 0 v100-a 4×V100, 1 v100-b 4×V100, 2 t4-c 2×T4, 3 cpu-d no GPU."""

from __future__ import annotations

from collections import Counter

import numpy as np

from gpuslice.hardware.mig import MigInstance, mig_gpu
from gpuslice.hardware.node import NodeSpec
from gpuslice.hardware.topology_profiles import profile
from gpuslice.ledger.ledger import Ledger, LedgerView
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode
from gpuslice.policies import PlacementOps, PolicyContext, TieBreak
from gpuslice.policies.mig_placement import MigPlacementOps, mig_placement_policy
from gpuslice.scheduler.placer import Placer, Unplaced
from gpuslice.units import GiB
from gpuslice.workload.job import TopologyNeed
from gpuslice.workload.request import Request

DGX1 = profile("dgx1-v100")
TWO = Request(cpu_milli=0, num_gpu=2, gpu_milli=1000)
SHARE = Request(cpu_milli=1000, num_gpu=1, gpu_milli=100)
A100 = mig_gpu("A100-80GB")
NONE = Request(cpu_milli=0)


def placer_for(ledger: Ledger, policy_cls: type[PlacementOps] = PlacementOps, **kw) -> Placer:
    return Placer(ledger, policy_cls(ledger.view, PolicyContext(rng=np.random.default_rng(0))), **kw)


def dgx1_with_busy(busy: tuple[int, ...] = (0, 1, 2, 5)) -> Ledger:
    ledger = Ledger([NodeSpec("dgx", 96_000, 512 * GiB, 8, "V100", 16 * GiB)])
    if busy:
        ledger.reserve(0, busy, Request(cpu_milli=0, num_gpu=len(busy), gpu_milli=1000))
    return ledger


# ---- the joint assignment of multi-GPU requests (place's ``later``) ----------------------------------


def test_a_pair_placed_beside_a_later_pair_takes_an_nvlink_pair_that_leaves_the_other_one_too():
    # one at a time the first pair takes GPUs 4 and 7 (NV2) and leaves only PCIe pairs (tests/scheduler/
    # test_node_batch.py); beside a later pair, both get an NVLink pair
    alone = placer_for(dgx1_with_busy(), topologies=[DGX1]).place(TWO)
    assert isinstance(alone, Placement) and alone.gpus == (4, 7)
    joint = placer_for(dgx1_with_busy(), topologies=[DGX1]).place(TWO, later=[TWO])
    assert isinstance(joint, Placement) and joint.gpus in ((3, 7), (4, 6))
    assert DGX1.nvlinks[joint.gpus[0], joint.gpus[1]] > 0


def test_on_a_cluster_the_joint_assignment_reads_the_chosen_nodes_gpus():
    ledger = Ledger([NodeSpec(f"dgx{i}", 96_000, 512 * GiB, 8, "V100", 16 * GiB) for i in range(2)])
    ledger.reserve(0, tuple(range(8)), Request(cpu_milli=0, num_gpu=8, gpu_milli=1000))  # node 0 is full
    ledger.reserve(1, (0, 1, 2, 5), Request(cpu_milli=0, num_gpu=4, gpu_milli=1000))
    placer = placer_for(ledger, topologies=[DGX1, DGX1])
    placed = placer.place(TWO, later=[TWO, TWO])
    assert isinstance(placed, Placement) and placed.node == 1 and placed.gpus in ((3, 7), (4, 6))


def test_only_later_requests_for_several_whole_gpus_join_the_assignment():
    later = [Request(cpu_milli=0, num_gpu=1, gpu_milli=1000), Request(cpu_milli=0, num_gpu=1, gpu_milli=500)]
    placed = placer_for(dgx1_with_busy(), topologies=[DGX1]).place(TWO, later=later)
    assert isinstance(placed, Placement) and placed.gpus == (4, 7)
    # a share is not a GPU set either, whatever waits after it: best fit, the lowest of the equal GPUs
    share = Request(cpu_milli=0, num_gpu=1, gpu_milli=500)
    placed = placer_for(dgx1_with_busy(), topologies=[DGX1]).place(share, later=[TWO])
    assert isinstance(placed, Placement) and placed.gpus == (3,)


def test_one_whole_gpu_is_not_a_gpu_set_beside_a_later_pair_it_takes_the_best_fit_gpu():
    placed = placer_for(dgx1_with_busy((0,)), topologies=[DGX1]).place(
        Request(cpu_milli=0, num_gpu=1, gpu_milli=1000), later=[TWO]
    )
    assert isinstance(placed, Placement) and placed.gpus == (1,)  # a joint assignment would give it GPU 4


def test_without_the_wiring_later_requests_change_nothing_and_the_lowest_free_gpus_are_taken():
    placed = placer_for(dgx1_with_busy()).place(TWO, later=[TWO])
    assert isinstance(placed, Placement) and placed.gpus == (3, 4)


def test_nodes_scored_all_nan_are_all_equal_and_a_random_tie_draws_among_them(ledger):
    class NanRandom(PlacementOps):
        name = "nan-random"
        tie_break = TieBreak.RANDOM

        def score(self, view: LedgerView, req: Request, nodes: np.ndarray) -> np.ndarray:
            return np.full(len(nodes), np.nan)

    chosen = {
        placer_for(ledger, NanRandom, rng=np.random.default_rng(seed)).choose_node(
            SHARE, np.array([True, True, True, False])
        )
        for seed in range(20)
    }
    assert len(chosen) > 1 and chosen <= {0, 1, 2}  # not always the first


# ---- a ledger that refuses after its fit rule said yes ------------------------------------------------


def test_a_reserve_refused_after_the_fit_rule_said_yes_is_unplaced_with_that_code(ledger, monkeypatch):
    refusal = Refusal(RefusalCode.INSUFFICIENT_GPU, 0)
    monkeypatch.setattr(ledger, "reserve", lambda node, gpus, req: refusal)
    assert placer_for(ledger).place(SHARE) == Unplaced(SHARE, 4, Counter({RefusalCode.INSUFFICIENT_GPU: 1}))


def test_a_mig_reserve_refused_after_the_layout_said_free_is_unplaced_with_that_code(monkeypatch):
    ledger = mig_ledger(1)
    refusal = Refusal(RefusalCode.NO_MIG_SLOT, 0)
    monkeypatch.setattr(ledger, "reserve_mig", lambda node, gpu, instance, req: refusal)
    req = Request(cpu_milli=1000, mig_profile="1g.10gb")
    assert placer_for(ledger).place(req) == Unplaced(req, 1, Counter({RefusalCode.NO_MIG_SLOT: 1}))


# ---- the MIG path ----------------------------------------------------------------------------------


def mig_ledger(nodes: int, gpus: int = 1) -> Ledger:
    specs = [NodeSpec(f"m{n}", 8_000, 64 * GiB, gpus, "A100-80GB", 80 * GiB) for n in range(nodes)]
    return Ledger(specs, mig={(n, g): A100 for n in range(nodes) for g in range(gpus)})


class Invalid(MigPlacementOps):
    name = "invalid"

    def choose(self, layout, profile):
        return 3  # 2g.20gb may not start at slice 3


class Events(PlacementOps):
    name = "events"

    def __init__(self, view: LedgerView, context: PolicyContext) -> None:
        super().__init__(view, context)
        self.placed: list[tuple[object, Placement]] = []

    def on_placed(self, view: LedgerView, placement: Placement) -> None:
        self.placed.append((view, placement))


def test_a_mig_request_starts_where_the_placers_mig_policy_says_and_the_policy_hears_of_it():
    req = Request(cpu_milli=1000, mig_profile="2g.20gb")
    default = placer_for(mig_ledger(1)).place(req)
    assert isinstance(default, Placement) and default.mig is not None and default.mig.instance.start == 4
    placer = placer_for(mig_ledger(1), Events, mig_policy=mig_placement_policy("first-free")())
    placed = placer.place(req)
    assert isinstance(placed, Placement) and placed.mig is not None and placed.mig.instance.start == 0
    assert isinstance(placer.policy, Events) and placer.policy.placed == [(placer.ledger.view, placed)]


def test_an_invalid_mig_start_falls_back_and_is_counted_under_the_mig_placement_hook():
    placer = placer_for(mig_ledger(1), mig_policy=Invalid())
    for _ in range(2):
        placed = placer.place(Request(cpu_milli=1000, mig_profile="2g.20gb"))
        assert isinstance(placed, Placement)
    assert placer.fallbacks == Counter({("mig-placement", "invalid"): 2})


def test_a_mig_request_that_fits_nowhere_is_unplaced_unexplained_when_asked():
    placer = placer_for(mig_ledger(1))
    req = Request(cpu_milli=1000, mig_profile="7g.80gb")
    assert isinstance(placer.place(req), Placement)
    assert placer.place(req, explain=False) == Unplaced(req, 1)
    explained = placer.place(req)
    assert isinstance(explained, Unplaced) and explained.reasons == Counter({RefusalCode.NO_MIG_SLOT: 1})


def test_the_fullest_node_is_judged_per_profile_not_from_another_profiles_answer():
    # node 0: GPU 0 holds 4g.40gb@0 and 1g.10gb@4 (5 slices, room for a 1g, not a 3g), GPU 1 is empty;
    # node 1: GPU 0 holds 6 slices (room for a 1g), GPU 1 is full; node 2: GPU 0 holds one 1g (room for
    # a 3g at slice 4), GPU 1 is full
    ledger = mig_ledger(3, gpus=2)
    for node, gpu, profile_name, start in (
        (0, 0, "4g.40gb", 0), (0, 0, "1g.10gb", 4),
        (1, 0, "4g.40gb", 0), (1, 0, "2g.20gb", 4),
        (1, 1, "7g.80gb", 0), (2, 0, "1g.10gb", 0), (2, 1, "7g.80gb", 0),
    ):  # fmt: skip
        assert isinstance(
            ledger.reserve_mig(node, gpu, MigInstance(A100.profile(profile_name), start), NONE), Placement
        )
    placer = placer_for(ledger)
    small = placer.place(Request(cpu_milli=0, mig_profile="1g.10gb"))
    assert isinstance(small, Placement) and small.node == 1  # 6 slices held: the fullest
    # for a 3g the fullest GPU with a start is node 2's (1 slice held), not node 0's empty GPU 1
    large = placer.place(Request(cpu_milli=0, mig_profile="3g.40gb"))
    assert isinstance(large, Placement) and (large.node, large.mig.gpu) == (2, 0)  # type: ignore[union-attr]


# ---- the Unplaced record ------------------------------------------------------------------------------


def test_an_explained_unplaced_carries_its_request_its_note_and_no_closest_node_where_it_fits(ledger):
    req = SHARE  # it fits; a home's own constraint (the note) ruled the nodes out
    result = Unplaced.explained(req, ledger, note="the claim's selector")
    assert (result.request, result.note, result.closest, result.closest_node) == (
        req, "the claim's selector", None, "",
    )  # fmt: skip
    assert str(result) == "0/4 nodes fit: 1 GPU model not allowed: the claim's selector"
    bare = Unplaced.explained(req, ledger)
    assert bare.note == "" and not str(bare).endswith(":")


def test_an_unexplained_unplaced_names_its_request(ledger):
    req = Request(cpu_milli=99_000)
    assert placer_for(ledger).place(req, explain=False) == Unplaced(req, 4)


# ---- why advice or a filter is refused ---------------------------------------------------------------


class Advises(PlacementOps):
    name = "advises"
    advice: tuple[object, ...] = ()

    def pick_gpus(self, view: LedgerView, req: Request, node: int):
        return self.advice


def advising(ledger: Ledger, advice: tuple[object, ...]) -> Placer:
    placer = placer_for(ledger, Advises)
    placer.policy.advice = advice  # type: ignore[attr-defined]
    return placer


def test_advice_of_a_gpu_too_full_is_refused_as_not_fitting(ledger):
    ledger.reserve(0, (3,), Request(cpu_milli=0, num_gpu=1, gpu_milli=950))
    placer = advising(ledger, (3,))
    assert placer.pick_gpus(SHARE, 0) == (0,)
    assert placer.fallbacks == Counter({("pick_gpus", "does not fit"): 1})


def test_advice_of_gpus_without_the_needed_link_is_refused_as_missing_the_need():
    ledger = dgx1_with_busy(())
    placer = advising(ledger, (0, 5))  # no NVLink between GPUs 0 and 5 on a DGX-1
    gpus = placer.pick_gpus(TWO, 0, topology=DGX1, need=TopologyNeed.NVLINK)
    assert gpus is not None and DGX1.nvlinks[gpus[0], gpus[1]] > 0
    assert placer.fallbacks == Counter({("pick_gpus", "topology need not met"): 1})
    linked = advising(ledger, (4, 7))  # an NVLink pair, not the default's (0, 3)
    assert linked.pick_gpus(TWO, 0, topology=DGX1, need=TopologyNeed.NVLINK) == (4, 7)
    assert linked.fallbacks == Counter()


def test_advice_of_a_bool_is_not_a_gpu_index(ledger):
    placer = advising(ledger, (True,))
    assert placer.pick_gpus(SHARE, 0) == (0,)
    assert placer.fallbacks == Counter({("pick_gpus", "not GPU indices"): 1})


def test_every_refused_batch_set_is_counted():
    ledger = dgx1_with_busy((0, 3))
    placer = placer_for(ledger, topologies=[DGX1])
    for _ in range(2):
        placer.pick_gpus(TWO, 0, topology=DGX1, batch=(2, 3))
    assert placer.fallbacks == Counter({("batch", "does not fit"): 2})


def test_a_filter_reads_the_request_and_one_without_a_shape_is_refused_as_the_wrong_shape(ledger):
    class NoShares(PlacementOps):
        name = "no-shares-on-node-0"

        def filter(self, view: LedgerView, req: Request) -> np.ndarray | None:
            mask = np.ones(view.node_count, dtype=bool)
            mask[0] = req.gpu_milli >= 1000
            return mask

    placed = placer_for(ledger, NoShares).place(SHARE)
    assert isinstance(placed, Placement) and placed.node == 1

    class ListFilter(PlacementOps):
        name = "list-filter"

        def filter(self, view: LedgerView, req: Request) -> np.ndarray | None:
            return [True] * view.node_count  # type: ignore[return-value]

    placer = placer_for(ledger, ListFilter)
    assert isinstance(placer.place(SHARE), Placement)
    assert placer.fallbacks == Counter({("filter", "wrong shape"): 1})


def test_normalize_gets_the_view_and_the_request(ledger):
    class PreferNode1ForShares(PlacementOps):
        name = "prefer-node-1-for-shares"

        def normalize(self, view: LedgerView, req: Request, scores: np.ndarray) -> np.ndarray:
            nodes = np.arange(view.node_count)[: len(scores)]
            return np.where((nodes == 1) & (req.gpu_milli < 1000), 1.0, 0.0)

    placed = placer_for(ledger, PreferNode1ForShares).place(SHARE)
    assert isinstance(placed, Placement) and placed.node == 1


def test_a_failing_notification_is_counted_under_its_hook(ledger):
    class RaisesOnPlaced(PlacementOps):
        name = "raises-on-placed"

        def on_placed(self, view: LedgerView, placement: Placement) -> None:
            raise RuntimeError("boom")

    placer = placer_for(ledger, RaisesOnPlaced)
    assert isinstance(placer.place(SHARE), Placement)
    assert placer.fallbacks == Counter({("on_placed", "exception"): 1})
