"""policies.random: a uniformly random feasible node and a random fitting GPU, from the seed."""

from __future__ import annotations

from collections.abc import Callable

from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement
from gpuslice.workload.request import Request

SHARE = Request(cpu_milli=1000, num_gpu=1, gpu_milli=500)
WHOLE_4 = Request(cpu_milli=1000, num_gpu=4, gpu_milli=1000)


def _placements(nodes: list[NodeSpec], make_placer: Callable, occupy: Callable, seed: int) -> list[tuple]:
    placer = make_placer(Ledger(nodes), "random", seed=seed)
    occupy(placer, 0, (0, 1, 2, 3), WHOLE_4)  # node 0 is full; node 3 has no GPU
    chosen = []
    for _ in range(4):
        result = placer.place(SHARE)
        assert isinstance(result, Placement)
        chosen.append((result.node, result.gpus))
    placer.ledger.check_invariants()
    return chosen


def test_random_places_only_on_feasible_nodes_and_spreads_over_them(
    small_nodes: list[NodeSpec], make_placer: Callable, occupy: Callable
) -> None:
    nodes = {node for seed in range(20) for node, _ in _placements(small_nodes, make_placer, occupy, seed)}
    assert nodes == {1, 2}


def test_random_is_the_same_for_a_seed_and_varies_with_the_seed(
    small_nodes: list[NodeSpec], make_placer: Callable, occupy: Callable
) -> None:
    runs = [_placements(small_nodes, make_placer, occupy, seed) for seed in range(6)]
    assert runs[0] == _placements(small_nodes, make_placer, occupy, 0)
    assert len({tuple(run) for run in runs}) > 1


def test_random_picks_among_the_gpus_that_fit(
    small_nodes: list[NodeSpec], make_placer: Callable, occupy: Callable
) -> None:
    placer = make_placer(Ledger(small_nodes), "random", seed=1)
    occupy(placer, 0, (1,), Request(cpu_milli=0, num_gpu=1, gpu_milli=800))  # GPU 1: 200 free
    picks = {placer.policy.pick_gpus(placer.ledger.view, SHARE, 0) for _ in range(40)}
    assert picks == {(0,), (2,), (3,)}


def test_random_takes_the_lowest_free_gpus_for_whole_gpu_requests(
    small_nodes: list[NodeSpec], make_placer: Callable, occupy: Callable
) -> None:
    placer = make_placer(Ledger(small_nodes), "random", seed=1)
    occupy(placer, 0, (0,), SHARE)
    two = Request(cpu_milli=1000, num_gpu=2, gpu_milli=1000)
    assert {placer.policy.pick_gpus(placer.ledger.view, two, 0) for _ in range(10)} == {(1, 2)}
