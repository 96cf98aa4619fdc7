"""policies.fgd: place where the target workload's expected fragmentation grows least.

Target workload: a 500-milli share and a whole GPU, equally likely (both 1 core, any model), so on a
V100 node F = 0.5 · (free on GPUs below 500) + 0.5 · (free on GPUs below 1000) while both shapes fit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement
from gpuslice.policies import PolicyContext
from gpuslice.policies.fgd import FGD
from gpuslice.policies.fgd_exact import FGDExact
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

SHARE_500 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=500)
WHOLE = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000)


@pytest.fixture
def target() -> TargetWorkload:
    return TargetWorkload.from_requests([SHARE_500, WHOLE])


def share(milli: int) -> Request:
    return Request(cpu_milli=1000, num_gpu=1, gpu_milli=milli)


def test_fgd_completes_the_half_used_gpu_instead_of_breaking_a_whole_one(
    ledger: Ledger, target: TargetWorkload, make_placer: Callable, occupy: Callable
) -> None:
    placer = make_placer(ledger, "fgd", target=target)
    occupy(placer, 1, (2,), share(500))
    # node 1 GPU 2: F 250 -> 0, gain 250 -> floor(100·sigmoid(0.25)) = 56;
    # a share on any full GPU: F 0 -> 250 (or 250 -> 500), gain −250 -> 43
    np.testing.assert_array_equal(
        placer.policy.score(ledger.view, SHARE_500, np.array([0, 1, 2])), [43, 56, 43]
    )
    result = placer.place(SHARE_500)
    assert isinstance(result, Placement)
    assert (result.node, result.gpus) == (1, (2,))


def test_fgd_picks_the_gpu_inside_a_node_that_grows_fragmentation_least(
    ledger: Ledger, target: TargetWorkload, make_placer: Callable, occupy: Callable
) -> None:
    placer = make_placer(ledger, "fgd", target=target)
    occupy(placer, 0, (3,), share(600))  # node 0 GPU 3: 400 free, too small for the 500 share
    occupy(placer, 0, (1,), share(300))  # node 0 GPU 1: 700 free: a share there leaves 200
    assert placer.policy.pick_gpus(ledger.view, SHARE_500, 0) == (1,)


@pytest.fixture
def near_tie(ledger: Ledger) -> Ledger:
    """Node 0 GPU 0 has 510 free, node 1 GPU 0 has 505: a 500 share there gains 245 vs 247.5 milli."""
    assert isinstance(ledger.reserve(0, (0,), share(490)), Placement)
    assert isinstance(ledger.reserve(1, (0,), share(495)), Placement)
    return ledger


def test_fgd_quantises_scores_so_a_few_milli_of_delta_tie_and_the_first_node_wins(
    near_tie: Ledger, target: TargetWorkload, make_placer: Callable
) -> None:
    placer = make_placer(near_tie, "fgd", target=target)
    np.testing.assert_array_equal(placer.policy.score(near_tie.view, SHARE_500, np.array([0, 1])), [56, 56])
    result = placer.place(SHARE_500)
    assert isinstance(result, Placement)
    assert (result.node, result.gpus) == (0, (0,))


def test_fgd_exact_breaks_that_tie_by_the_exact_delta(
    near_tie: Ledger, target: TargetWorkload, make_placer: Callable
) -> None:
    placer = make_placer(near_tie, "fgd-exact", target=target)
    np.testing.assert_allclose(placer.policy.score(near_tie.view, SHARE_500, np.array([0, 1])), [245, 247.5])
    result = placer.place(SHARE_500)
    assert isinstance(result, Placement)
    assert (result.node, result.gpus) == (1, (0,))


def test_fgd_takes_the_lowest_free_gpus_for_whole_gpu_requests(
    ledger: Ledger, target: TargetWorkload, make_placer: Callable, occupy: Callable
) -> None:
    placer = make_placer(ledger, "fgd", target=target)
    occupy(placer, 0, (0,), share(100))
    two = Request(cpu_milli=1000, num_gpu=2, gpu_milli=1000)
    assert placer.policy.pick_gpus(ledger.view, two, 0) == (1, 2)


def test_fgd_scores_a_cpu_only_request_by_what_its_cpu_takes_away(ledger: Ledger) -> None:
    # a share that needs 16 cores: taking 16 of node 0's 32 cores leaves it unable to run the share
    target = TargetWorkload.from_requests([Request(cpu_milli=16_000, num_gpu=1, gpu_milli=500)])
    policy = FGDExact(ledger.view, PolicyContext(rng=np.random.default_rng(0), target=target))
    scores = policy.score(ledger.view, Request(cpu_milli=16_001), np.array([0, 3]))
    np.testing.assert_allclose(scores, [-4000, 0])  # node 0: all 4000 free milli become a fragment


def test_fgd_needs_a_target_workload(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="target workload"):
        FGD(ledger.view, PolicyContext(rng=np.random.default_rng(0)))


def test_fgd_cached_fragmentation_agrees_with_a_fresh_policy_as_the_ledger_changes(
    ledger: Ledger, target: TargetWorkload, make_placer: Callable
) -> None:
    placer = make_placer(ledger, "fgd", target=target)
    requests = [share(500), share(300), WHOLE, share(200), share(700), Request(cpu_milli=20_000), share(500)]
    nodes = np.array([0, 1, 2])
    for req in requests:
        result = placer.place(req)
        assert isinstance(result, Placement)
        fresh = FGD(ledger.view, PolicyContext(rng=np.random.default_rng(0), target=target))
        for probe in (SHARE_500, share(250), WHOLE):
            np.testing.assert_array_equal(
                placer.policy.score(ledger.view, probe, nodes), fresh.score(ledger.view, probe, nodes)
            )
            for node in nodes:
                if ledger.fits(probe)[node]:
                    assert placer.policy.pick_gpus(ledger.view, probe, int(node)) == fresh.pick_gpus(
                        ledger.view, probe, int(node)
                    )


def test_fgd_scores_a_what_if_view_by_its_own_contents(small_nodes: list, target: TargetWorkload) -> None:
    real, what_if = Ledger(small_nodes), Ledger(small_nodes)
    assert isinstance(real.reserve(0, (0,), share(500)), Placement)  # node 0 version 1 in both
    assert isinstance(what_if.reserve(0, (0,), share(100)), Placement)
    policy = FGDExact(real.view, PolicyContext(rng=np.random.default_rng(0), target=target))
    fresh = FGDExact(what_if.view, PolicyContext(rng=np.random.default_rng(0), target=target))
    nodes = np.array([0])
    policy.score(real.view, SHARE_500, nodes)
    np.testing.assert_array_equal(
        policy.score(what_if.view, SHARE_500, nodes), fresh.score(what_if.view, SHARE_500, nodes)
    )
