"""policies.packing: shared GPUs first, then partly used nodes, then idle nodes (fewest GPUs first)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement
from gpuslice.workload.request import Request

V100 = "V100M16"


def share(milli: int, models: tuple[str, ...] = ()) -> Request:
    return Request(cpu_milli=1000, num_gpu=1, gpu_milli=milli, gpu_models=models)


WHOLE_V100 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000, gpu_models=(V100,))

CASES = [
    pytest.param([(1, (2,), share(300))], share(500), 1, (2,), id="a partly used GPU beats idle nodes"),
    pytest.param(
        [(0, (0,), share(300)), (1, (1,), share(400))], share(500), 1, (1,), id="the fuller shared GPU wins"
    ),
    pytest.param(
        [(1, (0,), share(800))], share(500), 1, (1,), id="a partly used node beats idle ones when no GPU fits"
    ),
    pytest.param([(1, (0,), share(300))], WHOLE_V100, 1, (1,), id="whole GPU goes to the partly used node"),
    pytest.param([], share(500), 2, (0,), id="of idle nodes the one with fewer GPUs"),
    pytest.param([(1, (0,), share(300))], Request(cpu_milli=1000), 0, (), id="CPU-only takes the first node"),
]


@pytest.mark.parametrize(("before", "req", "node", "gpus"), CASES)
def test_packing_picks_node_and_gpu(
    ledger: Ledger,
    make_placer: Callable,
    occupy: Callable,
    before: list,
    req: Request,
    node: int,
    gpus: tuple[int, ...],
) -> None:
    placer = make_placer(ledger, "packing")
    for args in before:
        occupy(placer, *args)
    result = placer.place(req)
    assert isinstance(result, Placement)
    assert (result.node, result.gpus) == (node, gpus)


def test_packing_scores_the_three_tiers_with_the_artifacts_integer_arithmetic(
    ledger: Ledger, make_placer: Callable, occupy: Callable
) -> None:
    placer = make_placer(ledger, "packing")
    occupy(placer, 0, (0,), share(300))  # node 0 GPU 0: 700 free
    occupy(placer, 1, (0,), share(800))  # node 1 GPU 0: 200 free, too little for 500
    scores = placer.policy.score(ledger.view, share(500), np.array([0, 1, 2]))
    # shared GPU: 100 − (70 // 10); takes one free GPU: 50 − 1; idle 2-GPU node: max(33 − 2, 2)
    np.testing.assert_array_equal(scores, [93, 49, 31])
