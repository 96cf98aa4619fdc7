"""MIG instances held in the ledger: reserve_mig / release, refusals as values, invariants, the view."""

from __future__ import annotations

import numpy as np
import pytest

from gpuslice.errors import LedgerError
from gpuslice.hardware.mig import MigInstance, MigLayout, mig_gpu
from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger import Ledger, Placement, Refusal, RefusalCode
from gpuslice.ledger.mig import MigHold, mig_request
from gpuslice.units import GiB
from gpuslice.workload.request import Request

A100 = mig_gpu("A100-80GB")
P1G, P3G, P7G, PME = (A100.profile(n) for n in ("1g.10gb", "3g.40gb", "7g.80gb", "1g.10gb+me"))
NONE = Request(cpu_milli=0)


def ledger() -> Ledger:
    """One node, GPU 1 and 2 in MIG mode, GPU 0 not."""
    node = NodeSpec("a", 8_000, 64 * GiB, 3, "A100-80GB", gpu_memory_bytes=80 * GiB)
    return Ledger([node], mig={(0, 1): A100, (0, 2): A100})


def state(led: Ledger) -> tuple[object, ...]:
    view = led.view
    arrays = tuple(getattr(view, name).copy() for name in view.ARRAYS)
    layouts = tuple(led.mig_layout(0, g) for g in range(3))
    return (*arrays, led.live_placements, led.allocated_gpu_milli, layouts)


def assert_same(a: tuple[object, ...], b: tuple[object, ...]) -> None:
    for x, y in zip(a, b, strict=True):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


def test_an_instance_is_held_in_the_layout_and_its_columns_and_given_back():
    led = ledger()
    assert led.mig_gpus == ((0, 1), (0, 2)) == led.view.mig_gpus
    assert led.mig_layout(0, 0) is None and led.mig_layout(0, 1) == MigLayout(A100)
    request = mig_request(P3G, 80 * GiB)
    placement = led.reserve_mig(0, 1, MigInstance(P3G, 4), request)
    assert isinstance(placement, Placement)
    assert placement.mig == MigHold(1, MigInstance(P3G, 4)) and placement.gpus == (1,)
    layout = led.view.mig_layout(0, 1)
    assert layout is not None and layout.instances == (MigInstance(P3G, 4),)
    assert led.view.free_gpu_milli[0, 1] == 1000 - 428
    assert led.view.free_gpu_memory_bytes[0, 1] == 40 * GiB
    led.check_invariants()
    led.release(placement)
    assert led.mig_layout(0, 1) == MigLayout(A100)
    assert led.view.free_gpu_milli[0, 1] == 1000
    led.check_invariants()


def test_an_instance_without_columns_changes_only_the_layout():
    led = ledger()
    before = led.view.free_gpu_milli.copy()
    placement = led.reserve_mig(0, 2, MigInstance(P7G, 0), NONE)
    assert isinstance(placement, Placement) and placement.gpus == ()
    np.testing.assert_array_equal(led.view.free_gpu_milli, before)
    assert led.mig_layout(0, 2).mask == 0xFF  # type: ignore[union-attr]
    assert led.view.version[0] == 1  # score caches see the node changed
    led.check_invariants()


@pytest.mark.parametrize(
    ("gpu", "instance", "why"),
    [
        (0, MigInstance(P1G, 0), "GPU 0 is not in MIG mode"),
        (5, MigInstance(P1G, 0), "no such GPU"),
        (1, MigInstance(P3G, 4), "overlaps the held 3g.40gb@4"),
        (1, MigInstance(P1G, 5), "overlaps the held 3g.40gb@4"),
        (1, MigInstance(P3G, 2), "3g.40gb may not start at slice 2"),
        (1, MigInstance(PME, 1), "only one +me instance per GPU"),
        (1, MigInstance(mig_gpu("H100-80GB").profile("1g.10gb"), 0), "a profile of another GPU model"),
    ],
)
def test_a_refused_instance_is_a_value_and_changes_nothing(gpu, instance, why):
    led = ledger()
    assert isinstance(led.reserve_mig(0, 1, MigInstance(P3G, 4), NONE), Placement)
    assert isinstance(led.reserve_mig(0, 1, MigInstance(PME, 0), NONE), Placement)
    before = state(led)
    expected = led.check_mig(0, gpu, instance, NONE)
    refused = led.reserve_mig(0, gpu, instance, NONE)
    assert isinstance(refused, Refusal), why
    assert refused == expected and refused.code is RefusalCode.NO_MIG_SLOT
    assert_same(before, state(led))
    led.check_invariants()


def test_an_instance_whose_columns_do_not_fit_is_refused_whole():
    led = ledger()
    whole = Request(cpu_milli=0, num_gpu=1, gpu_milli=1000)
    assert isinstance(led.reserve(0, (1,), whole), Placement)  # someone holds GPU 1's columns
    before = state(led)
    refused = led.reserve_mig(0, 1, MigInstance(P1G, 0), mig_request(P1G, 80 * GiB))
    assert isinstance(refused, Refusal) and refused.code is RefusalCode.INSUFFICIENT_GPU
    assert_same(before, state(led))  # the free slot was not taken either
    assert isinstance(led.reserve_mig(9, 1, MigInstance(P1G, 0), NONE), Refusal)


def test_the_invariant_check_sees_a_layout_that_disagrees_with_the_placements():
    led = ledger()
    assert isinstance(led.reserve_mig(0, 1, MigInstance(P1G, 0), NONE), Placement)
    led.check_invariants()
    led._mig.take(0, MigHold(2, MigInstance(P1G, 3)))  # an instance no placement holds
    with pytest.raises(LedgerError, match=r"^ledger invariant broken: MIG instances$"):
        led.check_invariants()


def test_mig_mode_on_a_gpu_that_does_not_exist_is_refused():
    node = NodeSpec("a", 0, 0, 2, "A100-80GB")
    with pytest.raises(ValueError, match="GPU 2 of node 0"):
        Ledger([node], mig={(0, 2): A100})


def test_a_mig_request_is_refused_as_columns_alone_naming_its_node():
    """``check`` and ``reserve`` never hold a MIG request without its instance (``reserve_mig`` does):
    refused with NO_MIG_SLOT on that node, and nothing taken."""
    led = ledger()
    before = state(led)
    mig = Request(cpu_milli=0, mig_profile="1g.10gb")
    assert led.check(0, (), mig) == Refusal(RefusalCode.NO_MIG_SLOT, 0)
    assert led.reserve(0, (1,), mig) == Refusal(RefusalCode.NO_MIG_SLOT, 0)
    assert_same(before, state(led))


class _Follower:
    """Held weakly by the ledger, so a plain object() will not do."""


def test_a_follower_reads_mig_instances_taken_and_given_back():
    led = ledger()
    led.follow(follower := _Follower())
    held = led.reserve_mig(0, 2, MigInstance(P3G, 4), mig_request(P3G, 80 * GiB))
    assert isinstance(held, Placement)
    led.release(held)
    assert led.changes(follower) == [(+1, held), (-1, held)]
