"""policies.bestfit: the node left with the least spare CPU and GPU wins.

Cluster (conftest): 0 v100-a 32 cores 4×V100, 1 v100-b 32 cores 4×V100, 2 t4-c 16 cores 2×T4,
3 cpu-d 16 cores no GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement
from gpuslice.policies.bestfit import BestFit
from gpuslice.workload.request import Request

V100 = "V100M16"
SHARE = Request(cpu_milli=1000, num_gpu=1, gpu_milli=500)
SHARE_V100 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=500, gpu_models=(V100,))
WHOLE = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000)

# (node, gpus, request) reserved before the request under test
CASES = [
    pytest.param([], SHARE, 2, id="the smallest GPU node is left with least"),
    pytest.param([(1, (0,), WHOLE)], SHARE_V100, 1, id="of two equal V100 nodes the fuller one"),
    pytest.param([(0, (), Request(cpu_milli=24_000))], SHARE_V100, 0, id="CPU counts as well as GPU"),
    pytest.param([], Request(cpu_milli=1000), 3, id="CPU-only prefers the node without GPUs"),
]


@pytest.mark.parametrize(("before", "req", "node"), CASES)
def test_bestfit_picks_the_node_with_least_left_over(
    ledger: Ledger, make_placer: Callable, occupy: Callable, before: list, req: Request, node: int
) -> None:
    placer = make_placer(ledger, "bestfit")
    for args in before:
        occupy(placer, *args)
    result = placer.place(req)
    assert isinstance(result, Placement)
    assert result.node == node


def test_bestfit_score_is_100_times_one_minus_the_halved_normalised_leftovers(ledger: Ledger) -> None:
    policy = BestFit(ledger.view, context=None)  # type: ignore[arg-type]
    scores = policy.score(ledger.view, SHARE, np.array([0, 2]))
    # node 0: 0.5·31000/128000 + 0.5·3500/8000 = 0.33984 -> 66; node 2: 0.5·15000/128000 + 0.5·1500/8000 -> 84
    np.testing.assert_array_equal(scores, [66, 84])


def test_bestfit_truncation_ties_near_equal_nodes_and_the_first_node_wins(
    ledger: Ledger, make_placer: Callable, occupy: Callable
) -> None:
    placer = make_placer(ledger, "bestfit")
    occupy(placer, 1, (), Request(cpu_milli=100))  # node 1 is 0.1 core fuller: not enough to change the score
    np.testing.assert_array_equal(placer.policy.score(ledger.view, SHARE_V100, np.array([0, 1])), [66, 66])
    result = placer.place(SHARE_V100)
    assert isinstance(result, Placement)
    assert result.node == 0


@pytest.mark.parametrize(
    ("scores", "normalised"),
    [
        ([10.0, 20.0, 30.0], [0, 50, 100]),
        ([66.0, 84.0, 70.0], [0, 100, 22]),
        ([40.0, 40.0], [0, 0]),
        ([7.0], [0]),
    ],
)
def test_bestfit_normalises_min_max_to_0_100_with_integer_division(
    ledger: Ledger, scores: list[float], normalised: list[int]
) -> None:
    policy = BestFit(ledger.view, context=None)  # type: ignore[arg-type]
    np.testing.assert_array_equal(policy.normalize(ledger.view, SHARE, np.array(scores)), normalised)
