"""policies.clustering: a request goes where its kind (share, 1 GPU, 2 GPUs …) already runs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement
from gpuslice.policies.clustering import Clustering
from gpuslice.workload.request import Request

SHARE_500 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=500)
SHARE_300 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=300)
WHOLE_1 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000)
WHOLE_2 = Request(cpu_milli=1000, num_gpu=2, gpu_milli=1000)


@pytest.fixture
def clustered(ledger: Ledger, make_placer: Callable, occupy: Callable):
    """Node 0 runs one whole GPU, node 1 one share; node 2 (T4) is idle."""
    placer = make_placer(ledger, "clustering")
    occupy(placer, 0, (0,), WHOLE_1)
    share = occupy(placer, 1, (0,), SHARE_500)
    return placer, share


@pytest.mark.parametrize(
    ("req", "node"),
    [
        pytest.param(SHARE_300, 1, id="a share joins the node hosting shares"),
        pytest.param(WHOLE_1, 0, id="a whole GPU joins the node hosting whole GPUs"),
        pytest.param(WHOLE_2, 2, id="a new kind prefers an idle node over other kinds"),
        pytest.param(Request(cpu_milli=1000), 0, id="CPU-only takes the first node"),
    ],
)
def test_clustering_prefers_a_node_hosting_the_same_kind(clustered, req: Request, node: int) -> None:
    placer, _ = clustered
    result = placer.place(req)
    assert isinstance(result, Placement)
    assert result.node == node


def test_clustering_score_is_bucket_plus_fill(clustered) -> None:
    placer, _ = clustered
    scores = placer.policy.score(placer.ledger.view, WHOLE_1, np.array([0, 1, 2]))
    # only-this-kind 75 + 25·5000//8000; other kinds 0 + 25·4500//8000; idle 25 + 25·6000//8000
    np.testing.assert_array_equal(scores, [90, 14, 43])


def test_a_node_with_several_kinds_ranks_between_one_kind_and_idle(clustered, occupy: Callable) -> None:
    placer, _ = clustered
    occupy(placer, 0, (1,), Request(cpu_milli=1000, num_gpu=1, gpu_milli=200))  # node 0: whole + share
    scores = placer.policy.score(placer.ledger.view, SHARE_300, np.array([0, 1, 2]))
    # mixed 50 + 25·5200//8000; share-only 75 + 25·4500//8000; idle 25 + 25·6000//8000
    np.testing.assert_array_equal(scores, [66, 89, 43])


def test_clustering_forgets_a_kind_when_its_task_is_released(clustered) -> None:
    placer, share = clustered
    policy = placer.policy
    assert isinstance(policy, Clustering)
    assert policy.kinds_on_node[1].sum() == 1
    placer.release(share)
    assert policy.kinds_on_node[1].sum() == 0
    result = placer.place(SHARE_300)  # no node hosts shares now: the idle T4 node (43) beats node 1 (37)
    assert isinstance(result, Placement)
    assert result.node == 2
