"""policies.fgd_scarcity: FGD, plus a price on GPU models that type-constrained tasks need.

Small cluster (conftest): nodes 0, 1 are 4 × V100M16 (32 cores), node 2 is 2 × T4 (16 cores), node 3 has
no GPU. Targets below mix a T4-only whole GPU with unconstrained tasks, so T4 is the scarce model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement
from gpuslice.policies import PLACEMENT
from gpuslice.policies.fgd_scarcity import ScarcityFGD, model_scarcity
from gpuslice.units import GiB
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

WHOLE = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000)
WHOLE_T4 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000, gpu_models=("T4",))
SHARE_500 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=500)
CPU_ONLY = Request(cpu_milli=2000)


@pytest.fixture
def t4_scarce() -> TargetWorkload:
    """Half the tasks need a T4: T4 is 2 of 10 GPUs but gets half of the expected demand."""
    return TargetWorkload.from_requests([WHOLE_T4, WHOLE])


@pytest.fixture
def unconstrained() -> TargetWorkload:
    return TargetWorkload.from_requests([SHARE_500, WHOLE, CPU_ONLY])


def scarcity_by_model(target: TargetWorkload, ledger: Ledger) -> dict[str, float]:
    return dict(zip(ledger.models, model_scarcity(target, ledger.view).tolist(), strict=True))


def test_policy_is_registered_under_its_name() -> None:
    assert PLACEMENT["fgd-scarcity"] is ScarcityFGD


@pytest.mark.parametrize(
    ("case", "requests", "expected"),
    [
        # T4 demand 0.5 per arrival on 2000 milli vs 1.0 on 10000 milli cluster-wide: 5× the average
        # T4: 0.5 · 1000 expected milli on 2000 milli of T4 = 0.25; all: 1000 on 10000 = 0.1
        ("t4-only tasks make T4 scarce", [WHOLE_T4, WHOLE], {"T4": 2.5, "V100M16": 0.0}),
        ("no constraint, no scarcity", [WHOLE, SHARE_500, CPU_ONLY], {"T4": 0.0, "V100M16": 0.0}),
        (
            "a list of every model spreads its demand by capacity",
            [Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000, gpu_models=("T4", "V100M16"))],
            {"T4": 1.0, "V100M16": 1.0},
        ),
    ],
)
def test_model_scarcity(ledger: Ledger, case: str, requests: list[Request], expected: dict) -> None:
    got = scarcity_by_model(TargetWorkload.from_requests(requests), ledger)
    assert got == pytest.approx(expected), case


def test_unconstrained_whole_gpu_avoids_the_small_pinned_model_even_when_it_comes_first(
    make_placer: Callable,
) -> None:
    # M: a third T4-only, a third V100-only, a third anything. For FGD either node's free GPUs are a
    # fragment to one third of M, so a whole GPU gains 333 milli on both, the scores tie and the first
    # node (T4) wins. But the T4 pool is half the V100 pool for the same pinned demand: e_T4 = 1,
    # e_V100 = 0.5, prices 500 vs 250 milli, and the priced policy takes the V100 GPU.
    whole_v100 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000, gpu_models=("V100M16",))
    target = TargetWorkload.from_requests([WHOLE_T4, whole_v100, WHOLE])
    nodes = [
        NodeSpec("t4", 16_000, 32 * GiB, 2, "T4"),
        NodeSpec("v100", 32_000, 64 * GiB, 4, "V100M16"),
    ]
    ledger = Ledger(nodes)
    assert scarcity_by_model(target, ledger) == pytest.approx({"T4": 1.0, "V100M16": 0.5})
    fgd = make_placer(Ledger(nodes), "fgd", target=target).place(WHOLE)
    ours = make_placer(ledger, "fgd-scarcity", target=target).place(WHOLE)
    assert isinstance(fgd, Placement) and isinstance(ours, Placement)
    assert fgd.node == 0
    assert ours.node == 1


def test_constrained_task_still_goes_to_its_model(
    ledger: Ledger, t4_scarce: TargetWorkload, make_placer: Callable
) -> None:
    result = make_placer(ledger, "fgd-scarcity", target=t4_scarce).place(WHOLE_T4)
    assert isinstance(result, Placement)
    assert result.node == 2


def test_without_constrained_shapes_gpu_scores_and_gpus_equal_fgd(
    ledger: Ledger, unconstrained: TargetWorkload, make_placer: Callable, occupy: Callable
) -> None:
    fgd = make_placer(ledger, "fgd", target=unconstrained)
    occupy(fgd, 0, (1,), Request(cpu_milli=1000, num_gpu=1, gpu_milli=300))
    ours = make_placer(ledger, "fgd-scarcity", target=unconstrained)
    nodes = np.array([0, 1, 2])
    for req in (SHARE_500, WHOLE, Request(cpu_milli=4000, num_gpu=2, gpu_milli=1000)):
        feasible = nodes[ledger.fits(req)[nodes]]
        np.testing.assert_array_equal(
            ours.policy.score(ledger.view, req, feasible), fgd.policy.score(ledger.view, req, feasible)
        )
    assert ours.policy.pick_gpus(ledger.view, SHARE_500, 0) == fgd.policy.pick_gpus(ledger.view, SHARE_500, 0)


def test_price_is_the_same_for_every_gpu_of_a_node_so_the_gpu_choice_is_fgds(
    ledger: Ledger, t4_scarce: TargetWorkload, make_placer: Callable, occupy: Callable
) -> None:
    share_t4 = Request(cpu_milli=1000, num_gpu=1, gpu_milli=500, gpu_models=("T4",))
    fgd = make_placer(ledger, "fgd", target=t4_scarce)
    occupy(fgd, 2, (1,), Request(cpu_milli=1000, num_gpu=1, gpu_milli=500))
    ours = make_placer(ledger, "fgd-scarcity", target=t4_scarce)
    assert ours.policy.pick_gpus(ledger.view, share_t4, 2) == fgd.policy.pick_gpus(ledger.view, share_t4, 2)


def test_cpu_only_task_pays_no_price_and_breaks_ties_toward_the_node_with_least_free_gpu(
    ledger: Ledger, t4_scarce: TargetWorkload, make_placer: Callable, occupy: Callable
) -> None:
    fgd = make_placer(ledger, "fgd", target=t4_scarce)
    occupy(fgd, 1, (0, 1, 2), Request(cpu_milli=3000, num_gpu=3, gpu_milli=1000))  # node 1: 1 GPU free
    ours = make_placer(ledger, "fgd-scarcity", target=t4_scarce)
    nodes = np.array([0, 1, 2, 3])
    fgd_scores = fgd.policy.score(ledger.view, CPU_ONLY, nodes)
    ours_scores = ours.policy.score(ledger.view, CPU_ONLY, nodes)
    # same integer part (no price on CPU), the fraction only orders FGD's ties
    np.testing.assert_array_equal(np.floor(ours_scores), fgd_scores)
    assert fgd_scores[0] == fgd_scores[1]
    feasible = ledger.fits(CPU_ONLY)
    assert fgd.choose_node(CPU_ONLY, feasible) == 0
    assert ours.choose_node(CPU_ONLY, feasible) == 3  # no GPU at all: nothing to strand


def test_needs_a_target_workload(ledger: Ledger, make_placer: Callable) -> None:
    with pytest.raises(ValueError, match="target workload"):
        make_placer(ledger, "fgd-scarcity")
