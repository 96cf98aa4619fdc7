"""policies (registry) and the contract every registered placement policy keeps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from gpuslice.errors import UnknownPolicy, UserError
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.placement import Placement
from gpuslice.policies import (
    FGD_PAPER_POLICIES,
    PLACEMENT,
    PlacementOps,
    PolicyContext,
    make_policy,
    placement_policy,
)
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

EXPECTED = {
    "random",
    "dotprod",
    "clustering",
    "packing",
    "bestfit",
    "fgd",
    "fgd-exact",
    "fgd-scarcity",
    "hami-binpack",
    "hami-spread",
}
POLICIES = sorted(PLACEMENT)


def test_the_registry_maps_each_policy_name_to_its_class() -> None:
    assert set(PLACEMENT) == EXPECTED
    for name, cls in PLACEMENT.items():
        assert cls.name == name
        assert issubclass(cls, PlacementOps)


def test_every_registered_policy_says_what_it_does() -> None:
    for cls in PLACEMENT.values():
        assert cls.summary and cls.summary != PlacementOps.summary, cls.name
        module = __import__(cls.__module__, fromlist=["_"])
        assert module.__doc__ and "Source" in module.__doc__, cls.__module__


def test_placement_policy_returns_the_registered_class() -> None:
    assert placement_policy("fgd") is PLACEMENT["fgd"]


def test_an_unknown_policy_name_lists_the_known_ones_sorted() -> None:
    with pytest.raises(UnknownPolicy) as info:
        placement_policy("fdg")
    message = str(info.value)
    assert "'fdg' is not a placement policy" in message
    assert "known: " + ", ".join(sorted(EXPECTED)) in message
    assert isinstance(info.value, UserError)


def test_make_policy_builds_the_policy_over_the_view_and_context(ledger: Ledger) -> None:
    context = PolicyContext(rng=np.random.default_rng(0))
    policy = make_policy("bestfit", ledger.view, context)
    assert isinstance(policy, PLACEMENT["bestfit"])
    assert policy.view is ledger.view
    assert policy.context is context


def test_the_fgd_paper_policies_are_registered_in_the_papers_order() -> None:
    assert list(FGD_PAPER_POLICIES) == ["random", "dotprod", "clustering", "packing", "bestfit", "fgd"]
    assert set(FGD_PAPER_POLICIES) <= set(PLACEMENT)
    assert [d[:2] for d in FGD_PAPER_POLICIES.values()] == ["01", "02", "03", "04", "05", "06"]


@pytest.mark.parametrize("name", sorted(EXPECTED - {"fgd", "fgd-exact", "fgd-scarcity"}))
def test_policies_other_than_fgd_need_no_target_workload(ledger: Ledger, name: str) -> None:
    policy = make_policy(name, ledger.view, PolicyContext(rng=np.random.default_rng(0)))
    assert policy.name == name


# ---- the contract ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_places_a_mixed_batch_without_fallback_or_overcommit(
    name: str,
    ledger: Ledger,
    mixed_requests: list[Request],
    mixed_target: TargetWorkload,
    make_placer: Callable,
) -> None:
    placer = make_placer(ledger, name, target=mixed_target, seed=3)
    for req in mixed_requests:
        result = placer.place(req)
        assert isinstance(result, Placement), f"{name} could not place {req}: {result}"
        assert result.request == req
        ledger.check_invariants()
    assert placer.fallbacks == Counter()
    assert len(ledger.live_placements) == len(mixed_requests)
    for placement in ledger.live_placements:
        placer.release(placement)
    ledger.check_invariants()
    assert ledger.allocated_gpu_milli == 0


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_scores_feasible_nodes_repeatably_and_leaves_the_view_unchanged(
    name: str,
    ledger: Ledger,
    mixed_requests: list[Request],
    mixed_target: TargetWorkload,
    make_placer: Callable,
    snapshot: Callable,
    same_state: Callable,
) -> None:
    placer = make_placer(ledger, name, target=mixed_target, seed=3)
    for req in mixed_requests[:4]:  # a cluster that is partly used
        assert isinstance(placer.place(req), Placement)
    policy, view = placer.policy, ledger.view
    scored = 0
    for req in mixed_requests:
        nodes = np.flatnonzero(placer.feasible(req))
        if len(nodes) == 0:  # e.g. the T4 whole GPU once both T4s are in use
            continue
        scored += 1
        before = snapshot(ledger)
        first = np.asarray(policy.score(view, req, nodes), dtype=float)
        second = np.asarray(policy.score(view, req, nodes), dtype=float)
        normalised = np.asarray(policy.normalize(view, req, first.copy()), dtype=float)
        same_state(before, snapshot(ledger))
        assert first.shape == (len(nodes),)
        assert not np.isnan(first).any()
        np.testing.assert_array_equal(first, second)
        assert normalised.shape == first.shape
    assert scored >= len(mixed_requests) - 1


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_advises_gpus_the_ledger_accepts_on_every_feasible_node(
    name: str,
    ledger: Ledger,
    mixed_requests: list[Request],
    mixed_target: TargetWorkload,
    make_placer: Callable,
    snapshot: Callable,
    same_state: Callable,
) -> None:
    placer = make_placer(ledger, name, target=mixed_target, seed=3)
    for req in mixed_requests[:4]:
        assert isinstance(placer.place(req), Placement)
    for req in mixed_requests:
        for node in np.flatnonzero(placer.feasible(req)):
            before = snapshot(ledger)
            gpus = placer.policy.pick_gpus(ledger.view, req, int(node))
            same_state(before, snapshot(ledger))
            # None is "no advice": the mechanism's default GPUs, which the ledger must accept too
            if gpus is not None:
                assert ledger.check(int(node), gpus, req) is None, f"{name}: {gpus} on node {node} for {req}"
            chosen = placer.pick_gpus(req, int(node))
            assert chosen is not None and ledger.check(int(node), chosen, req) is None, f"{name}: {chosen}"
