"""policies.hami: HAMi's binpack (fullest node and GPU) and spread (emptiest), ten tasks per GPU."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement
from gpuslice.scheduler.placer import Unplaced
from gpuslice.workload.request import Request

V100 = "V100M16"
SHARE_V100 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=200, gpu_models=(V100,))
TINY_T4 = Request(cpu_milli=10, num_gpu=1, gpu_milli=10, gpu_models=("T4",))


@pytest.fixture
def one_share(ledger: Ledger) -> Ledger:
    """Node 0 GPU 0 runs a 300-milli share; node 1 (same model) is idle."""
    assert isinstance(ledger.reserve(0, (0,), Request(cpu_milli=1000, num_gpu=1, gpu_milli=300)), Placement)
    return ledger


@pytest.mark.parametrize(
    ("policy", "node", "gpus"),
    [
        pytest.param("hami-binpack", 0, (0,), id="binpack joins the used node and GPU"),
        pytest.param("hami-spread", 1, (0,), id="spread goes to the idle node"),
    ],
)
def test_binpack_and_spread_choose_opposite_nodes(
    one_share: Ledger, make_placer: Callable, policy: str, node: int, gpus: tuple[int, ...]
) -> None:
    result = make_placer(one_share, policy).place(SHARE_V100)
    assert isinstance(result, Placement)
    assert (result.node, result.gpus) == (node, gpus)


@pytest.mark.parametrize(("policy", "gpus"), [("hami-binpack", (0,)), ("hami-spread", (1,))])
def test_binpack_and_spread_choose_opposite_gpus_inside_a_node(
    one_share: Ledger, make_placer: Callable, policy: str, gpus: tuple[int, ...]
) -> None:
    placer = make_placer(one_share, policy)
    assert placer.policy.pick_gpus(one_share.view, SHARE_V100, 0) == gpus


def test_hami_node_score_counts_slots_compute_and_memory(one_share: Ledger, make_placer: Callable) -> None:
    binpack = make_placer(one_share, "hami-binpack").policy
    spread = make_placer(one_share, "hami-spread").policy
    nodes = np.array([0, 1])
    # 10 · (1 task / 40 slots + 2 · 300 / 4000 milli) = 1.75
    np.testing.assert_allclose(binpack.score(one_share.view, SHARE_V100, nodes), [1.75, 0])
    np.testing.assert_allclose(spread.score(one_share.view, SHARE_V100, nodes), [-1.75, 0])


@pytest.mark.parametrize("policy", ["hami-binpack", "hami-spread"])
def test_hami_refuses_a_gpu_holding_ten_tasks_even_with_free_capacity(
    ledger: Ledger, make_placer: Callable, occupy: Callable, policy: str
) -> None:
    placer = make_placer(ledger, policy)
    for gpu in (0, 1):
        for _ in range(10):
            occupy(placer, 2, (gpu,), TINY_T4)
    assert ledger.fits(TINY_T4)[2]  # 900 milli free on each T4
    refused = placer.place(TINY_T4)
    assert isinstance(refused, Unplaced)
    assert str(refused) == "0/4 nodes fit: 3 GPU model not allowed, 1 excluded by the placement policy"
    placer.release(ledger.live_placements[0])  # one slot opens on GPU 0
    result = placer.place(TINY_T4)
    assert isinstance(result, Placement)
    assert (result.node, result.gpus) == (2, (0,))
