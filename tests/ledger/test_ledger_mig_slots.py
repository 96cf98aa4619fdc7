"""The ledger's MIG records: the per-profile slot cache the fit rule reads (kept current by every
reserve and release, on that node only, read-only), the refusal records of ``check_mig``, the order of a
node's MIG GPUs, and the invariant check over the cache and the instances."""

from __future__ import annotations

import numpy as np
import pytest

from gpuslice.errors import LedgerError
from gpuslice.hardware.mig import MigInstance, mig_gpu
from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger import Ledger, Placement, Refusal, RefusalCode
from gpuslice.ledger.mig import MigHold, mig_request
from gpuslice.units import GiB
from gpuslice.workload.request import Request

A100 = mig_gpu("A100-80GB")
P1G, P3G, P7G = (A100.profile(n) for n in ("1g.10gb", "3g.40gb", "7g.80gb"))
NONE = Request(cpu_milli=0)


def two_nodes() -> Ledger:
    """Node 0: GPUs 2 and 1 in MIG mode (given out of order), GPU 0 not; node 1: GPU 0 in MIG mode;
    node 2: no MIG GPU."""
    nodes = [NodeSpec(f"n{i}", 8_000, 64 * GiB, 3, "A100-80GB", gpu_memory_bytes=80 * GiB) for i in range(3)]
    return Ledger(nodes, mig={(0, 2): A100, (0, 1): A100, (1, 0): A100})


def test_a_nodes_mig_gpus_are_listed_lowest_first():
    led = two_nodes()
    assert led.mig_gpus_on(0) == (1, 2) and led.mig_gpus_on(1) == (0,) and led.mig_gpus_on(2) == ()


def test_the_slot_cache_follows_every_reserve_and_release_on_that_node_only_for_every_profile_asked():
    led = two_nodes()
    assert led.mig_slots("7g.80gb").tolist() == [True, True, False]
    assert led.mig_slots("1g.10gb").tolist() == [True, True, False]
    whole = led.reserve_mig(1, 0, MigInstance(P7G, 0), NONE)
    assert isinstance(whole, Placement)
    assert led.mig_slots("7g.80gb").tolist() == [True, False, False]
    assert led.mig_slots("1g.10gb").tolist() == [True, False, False]
    # node 0: one GPU full is not enough to lose the slot; both are
    first = led.reserve_mig(0, 1, MigInstance(P7G, 0), NONE)
    assert isinstance(first, Placement) and led.mig_slots("7g.80gb").tolist() == [True, False, False]
    second = led.reserve_mig(0, 2, MigInstance(P3G, 4), NONE)
    assert isinstance(second, Placement)
    assert led.mig_slots("7g.80gb").tolist() == [False, False, False]
    assert led.mig_slots("1g.10gb").tolist() == [True, False, False]
    led.release(whole)
    assert led.mig_slots("7g.80gb").tolist() == [False, True, False]
    assert led.mig_slots("1g.10gb").tolist() == [True, True, False]
    led.check_invariants()


def test_the_slot_cache_stays_read_only_after_a_refresh():
    led = two_nodes()
    slots = led.mig_slots("3g.40gb")
    with pytest.raises(ValueError):
        slots[0] = False
    assert isinstance(led.reserve_mig(0, 1, MigInstance(P3G, 0), NONE), Placement)
    with pytest.raises(ValueError):
        led.mig_slots("3g.40gb")[2] = True
    assert led.mig_slots("3g.40gb").dtype == np.bool_


def test_check_mig_refusals_name_the_node_and_where_one_gpu_decided_the_gpu():
    led = two_nodes()
    assert led.check_mig(3, 1, MigInstance(P1G, 0), NONE) == Refusal(RefusalCode.NO_SUCH_NODE, 3)
    assert led.check_mig(-1, 1, MigInstance(P1G, 0), NONE) == Refusal(RefusalCode.NO_SUCH_NODE, -1)
    other_profile = Request(cpu_milli=0, mig_profile="3g.40gb")
    assert led.check_mig(0, 1, MigInstance(P1G, 0), other_profile) == Refusal(
        RefusalCode.NO_MIG_SLOT, 0, gpu=1
    )
    assert led.check_mig(0, 1, MigInstance(P1G, 0), Request(cpu_milli=0, mig_profile="1g.10gb")) is None
    pinned = Request(cpu_milli=0, gpu_models=("H100",))
    assert led.check_mig(0, 1, MigInstance(P1G, 0), pinned) == Refusal(RefusalCode.GPU_MODEL_NOT_ALLOWED, 0)
    excluded = Request(cpu_milli=0, excluded_gpu_models=("A100-80GB",))
    assert led.check_mig(0, 1, MigInstance(P1G, 0), excluded) == Refusal(RefusalCode.GPU_MODEL_NOT_ALLOWED, 0)
    assert led.check_mig(0, 0, MigInstance(P1G, 0), NONE) == Refusal(RefusalCode.NO_MIG_SLOT, 0, gpu=0)
    assert led.check_mig(0, 2, MigInstance(P3G, 2), NONE) == Refusal(RefusalCode.NO_MIG_SLOT, 0, gpu=2)
    too_much_cpu = Request(cpu_milli=9_000)
    refusal = led.check_mig(0, 1, MigInstance(P1G, 0), too_much_cpu)
    assert refusal is not None and (refusal.code, refusal.node) == (RefusalCode.INSUFFICIENT_CPU, 0)


def test_the_invariant_check_sees_a_stale_slot_and_an_instance_on_a_gpu_not_in_mig_mode():
    led = two_nodes()
    slots = led.mig_slots("7g.80gb")
    assert isinstance(led.reserve_mig(1, 0, MigInstance(P7G, 0), NONE), Placement)
    led.check_invariants()
    slots.flags.writeable = True
    slots[1] = True  # the cache says a 7g still fits on node 1
    with pytest.raises(LedgerError, match=r"^ledger invariant broken: MIG instances$"):
        led.check_invariants()
    slots[1] = False
    led.check_invariants()
    stray = Placement(node=0, gpus=(), request=NONE, id=99, mig=MigHold(0, MigInstance(P1G, 0)))
    assert not led._mig.agrees_with([*led.live_placements, stray])  # GPU 0 of node 0 is not in MIG mode


def test_a_mig_instances_columns_take_no_cpu_and_whole_bytes_of_its_gpus_memory():
    odd = 80 * GiB + 1  # not a multiple of the 8 memory slices
    request = mig_request(P3G, odd)
    assert request == Request(cpu_milli=0, num_gpu=1, gpu_milli=428, gpu_memory_bytes=odd * 4 // 8)
    assert type(request.gpu_memory_bytes) is int


def test_a_slot_array_once_returned_is_the_one_kept_current():
    """``mig_slots`` hands out the ledger's own array ("read-only, kept current"): asking again gives the
    same array, and one a caller kept follows later reserves."""
    led = two_nodes()
    kept = led.mig_slots("7g.80gb")
    assert led.mig_slots("7g.80gb") is kept
    assert isinstance(led.reserve_mig(1, 0, MigInstance(P7G, 0), NONE), Placement)
    assert kept.tolist() == [True, False, False]


def test_the_view_lists_a_nodes_mig_gpus_as_the_ledger_does():
    led = two_nodes()
    assert [led.view.mig_gpus_on(node) for node in range(3)] == [(1, 2), (0,), ()]
