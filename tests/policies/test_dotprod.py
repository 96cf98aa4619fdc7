"""policies.dotprod: Tetris alignment — a larger free·request product scores lower."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement
from gpuslice.policies.dotprod import DotProd
from gpuslice.workload.request import Request

V100 = "V100M16"
SHARE = Request(cpu_milli=8000, num_gpu=1, gpu_milli=500)
TWO = Request(cpu_milli=8000, num_gpu=2, gpu_milli=1000)
TWO_V100 = Request(cpu_milli=8000, num_gpu=2, gpu_milli=1000, gpu_models=(V100,))
WHOLE = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000)


def test_dotprod_integer_score_on_known_nodes(ledger: Ledger) -> None:
    policy = DotProd(ledger.view, context=None)  # type: ignore[arg-type]
    scores = policy.score(ledger.view, SHARE, np.array([0, 2]))
    # node 0: 32000/128000 · 8000/128000 + 4000/8000 · 500/8000 = 0.046875 -> trunc(97.65625) = 97
    # node 2: 16000/128000 · 8000/128000 + 2000/8000 · 500/8000 = 0.0234375 -> trunc(98.828125) = 98
    np.testing.assert_array_equal(scores, [97, 98])


@pytest.mark.parametrize(
    ("req", "node"),
    [
        pytest.param(TWO, 2, id="the node with least free in the requested directions"),
        pytest.param(TWO_V100, 1, id="among V100 nodes the one with a GPU taken"),
    ],
)
def test_dotprod_picks_the_node_with_the_smallest_product(
    ledger: Ledger, make_placer: Callable, occupy: Callable, req: Request, node: int
) -> None:
    placer = make_placer(ledger, "dotprod")
    occupy(placer, 1, (0,), WHOLE)
    # node 0: 0.25·0.0625 + 0.5·0.25 -> 92; node 1: 0.2421875·0.0625 + 0.375·0.25 -> 94; node 2: -> 96
    np.testing.assert_array_equal(placer.policy.score(ledger.view, TWO, np.array([0, 1, 2])), [92, 94, 96])
    result = placer.place(req)
    assert isinstance(result, Placement)
    assert result.node == node
