"""The ledger's own state: a whole GPU set aside, a copy that carries its state but not its followers,
the journal its followers read, and the invariant check that tests lean on (it must catch each column
going wrong)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from gpuslice.errors import LedgerError
from gpuslice.hardware.node import MAX_GPUS_PER_NODE, NodeSpec
from gpuslice.ledger import Ledger, Placement, Refusal, RefusalCode
from gpuslice.ledger.placement import Unit
from gpuslice.units import GiB
from gpuslice.workload.request import Request


class Follower:
    """Something that follows a ledger (held weakly, so a plain object() will not do)."""


SHARE = Request(cpu_milli=1000, memory_bytes=GiB, num_gpu=1, gpu_milli=300, gpu_memory_bytes=2 * GiB)


def two_nodes() -> Ledger:
    return Ledger(
        [NodeSpec(f"n{i}", 8_000, 32 * GiB, 2, "A100", gpu_memory_bytes=16 * GiB) for i in range(2)]
    )


def test_holding_a_whole_gpu_takes_all_its_compute_and_memory_and_gives_them_back() -> None:
    ledger = two_nodes()
    held = ledger.hold_whole(1, 1)
    assert isinstance(held, Placement) and (held.node, held.gpus) == (1, (1,))
    assert (held.request.num_gpu, held.request.gpu_milli, held.request.gpu_memory_bytes) == (
        1,
        1000,
        16 * GiB,
    )
    assert (held.request.cpu_milli, held.request.memory_bytes) == (0, 0)
    view = ledger.view
    assert (view.free_gpu_milli[1, 1], view.free_gpu_memory_bytes[1, 1]) == (0, 0)
    assert (view.free_gpu_milli[1, 0], view.free_cpu_milli[1]) == (1000, 8_000)  # nothing else taken
    assert isinstance(ledger.check(1, (1,), SHARE), Refusal)
    ledger.check_invariants()
    ledger.release(held)
    assert (view.free_gpu_milli[1, 1], view.free_gpu_memory_bytes[1, 1]) == (1000, 16 * GiB)


def test_a_gpu_that_is_partly_used_or_not_there_cannot_be_held_whole() -> None:
    ledger = two_nodes()
    assert isinstance(ledger.reserve(0, (0,), SHARE), Placement)
    assert ledger.hold_whole(0, 0) == ledger.check(
        0, (0,), Request(cpu_milli=0, num_gpu=1, gpu_milli=1000, gpu_memory_bytes=16 * GiB)
    )
    assert ledger.hold_whole(0, 0).code is RefusalCode.INSUFFICIENT_GPU_MEMORY
    assert ledger.hold_whole(2, 0) == Refusal(RefusalCode.NO_SUCH_NODE, 2)
    assert ledger.hold_whole(-1, 0) == Refusal(RefusalCode.NO_SUCH_NODE, -1)
    assert ledger.hold_whole(0, 2).code is RefusalCode.NO_SUCH_GPU
    assert ledger.hold_whole(0, 99).code is RefusalCode.NO_SUCH_GPU
    assert ledger.hold_whole(0, MAX_GPUS_PER_NODE) == Refusal(
        RefusalCode.NO_SUCH_GPU, 0, gpu=MAX_GPUS_PER_NODE
    )
    ledger.check_invariants()


def test_a_copy_carries_the_state_and_the_next_id_but_not_the_followers() -> None:
    ledger = two_nodes()
    ledger.follow(follower := Follower())
    first = ledger.reserve(0, (1,), SHARE)
    assert isinstance(first, Placement)
    copy = pickle.loads(pickle.dumps(ledger))
    assert copy.live_placements == ledger.live_placements
    for column in ("free_cpu_milli", "free_memory_bytes", "free_gpu_milli", "free_gpu_memory_bytes"):
        np.testing.assert_array_equal(getattr(copy.view, column), getattr(ledger.view, column))
    assert copy.view.free_gpu_milli is not ledger.view.free_gpu_milli  # its view reads its own columns
    second, third = copy.reserve(1, (0,), SHARE), ledger.reserve(1, (0,), SHARE)
    assert isinstance(second, Placement) and isinstance(third, Placement)
    assert second.id == third.id == first.id + 1  # ids go on from where the original was, in each
    assert copy.view.free_gpu_milli[1, 0] == 700 and ledger.view.free_gpu_milli[1, 0] == 700
    with pytest.raises(KeyError):
        copy.changes(follower)  # followers stay with the original
    assert ledger.changes(follower) == [(+1, first), (+1, third)]
    copy.check_invariants()


def test_each_follower_reads_every_change_once_in_order() -> None:
    ledger = two_nodes()
    a, b = Follower(), Follower()
    ledger.follow(a)
    taken = ledger.reserve(0, (0,), SHARE)
    ledger.follow(b)  # b sees only what happens from now on
    assert isinstance(taken, Placement)
    ledger.release(taken)
    again = ledger.reserve(1, (1,), SHARE)
    assert ledger.changes(a) == [(+1, taken), (-1, taken), (+1, again)]
    assert ledger.changes(a) == []
    assert ledger.changes(b) == [(-1, taken), (+1, again)]  # still there after a read them
    ledger.release(again)
    assert ledger.changes(b) == [(-1, again)]
    assert ledger.changes(a) == [(-1, again)]


@pytest.mark.parametrize(
    ("column", "node", "gpu", "delta", "named"),
    [
        ("_free_cpu", 0, None, -1, "free CPU"),
        ("_free_memory", 1, None, 1, "free memory"),
        ("_free_gpu", 0, 1, -1, "free GPU"),
        ("_free_gpu_memory", 1, 0, 1, "free GPU memory"),
        ("_gpu_tasks", 0, 0, 1, "GPU task counts"),
    ],
)
def test_the_invariant_check_names_a_column_that_disagrees_with_the_placements(
    column, node, gpu, delta, named
):
    ledger = two_nodes()
    assert isinstance(ledger.reserve(0, (1,), SHARE), Placement)
    ledger.check_invariants()
    values = getattr(ledger, column)
    values[(node, gpu) if gpu is not None else node] += delta
    with pytest.raises(LedgerError, match=f"^ledger invariant broken: {named}$"):
        ledger.check_invariants()


def test_the_invariant_check_catches_a_wrong_total_and_a_negative_column() -> None:
    ledger = two_nodes()
    assert isinstance(ledger.reserve(0, (1,), SHARE), Placement)
    ledger.allocated_gpu_milli += 1
    with pytest.raises(LedgerError, match="allocated total"):
        ledger.check_invariants()
    ledger.allocated_gpu_milli -= 1
    ledger._free_cpu[1] = -5  # and the capacity it is checked against, so that only the sign is wrong
    ledger._cpu_capacity[1] = -5
    with pytest.raises(LedgerError, match=r"^ledger invariant broken: non-negative$"):
        ledger.check_invariants()


def test_a_reserve_refused_on_gpu_memory_names_the_gpu_and_its_amounts() -> None:
    ledger = two_nodes()
    assert isinstance(ledger.reserve(1, (0,), SHARE), Placement)  # 14 GiB left on node 1 GPU 0
    big = Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=15 * GiB)
    refused = ledger.reserve(1, (0,), big)
    assert refused == Refusal(
        RefusalCode.INSUFFICIENT_GPU_MEMORY, 1, gpu=0, need=15 * GiB, free=14 * GiB, capacity=16 * GiB,
        unit=Unit.GPU_MEMORY,
    )  # fmt: skip
    assert (
        str(refused)
        == "insufficient free GPU memory on node 1 GPU 0 (need 15 GiB, free 14 GiB of 16 GiB GPU memory)"
    )


def test_host_memory_that_is_exactly_enough_is_enough() -> None:
    ledger = two_nodes()
    exact = Request(cpu_milli=8_000, memory_bytes=32 * GiB)
    assert isinstance(ledger.reserve(0, (), exact), Placement)
    assert ledger.reserve(0, (), Request(cpu_milli=0, memory_bytes=1)).code is RefusalCode.INSUFFICIENT_MEMORY


def test_mig_mode_on_a_node_or_gpu_that_does_not_exist_is_refused() -> None:
    from gpuslice.hardware.mig import mig_gpu

    nodes = [NodeSpec("a", 8_000, 32 * GiB, 2, "A100-80GB", gpu_memory_bytes=80 * GiB)]
    table = mig_gpu("a100-80gb")
    for where in ((1, 0), (0, 2), (-1, 0)):
        with pytest.raises(ValueError, match="does not exist"):
            Ledger(nodes, mig={where: table})
    Ledger(nodes, mig={(0, 1): table}).check_invariants()


def test_a_copy_can_be_followed_and_carries_no_journal_nor_view() -> None:
    """A copy starts a journal of its own for its own followers. What it is made of does not depend on the
    original's followers or what they left unread: its pickle is the same as that of a twin that never
    had any, and it does not carry the view (bound again on load)."""
    ledger, twin = two_nodes(), two_nodes()
    ledger.follow(follower := Follower())
    for copy_from in (ledger, twin):
        assert isinstance(copy_from.reserve(0, (1,), SHARE), Placement)
    ledger.changes(follower)  # read, so the journal has moved on ...
    for copy_from in (ledger, twin):
        assert isinstance(copy_from.reserve(1, (0,), SHARE), Placement)  # ... and one entry left unread
    assert pickle.dumps(ledger) == pickle.dumps(twin)
    assert b"LedgerView" not in pickle.dumps(ledger)
    copy = pickle.loads(pickle.dumps(ledger))
    copy.follow(mine := Follower())
    taken = copy.reserve(1, (1,), SHARE)
    assert isinstance(taken, Placement)
    copy.release(taken)
    assert copy.changes(mine) == [(+1, taken), (-1, taken)]
    assert copy.changes(mine) == []


def test_shares_of_one_gpu_are_counted_and_every_broken_invariant_is_named_at_once() -> None:
    """Two shares on one GPU keep the invariants (its task count is 2). A placement the columns never took
    (put among the live ones by hand), worth more than GPU 0 has, breaks five at once, named in the
    check's order."""
    ledger = two_nodes()
    for _ in range(2):
        assert isinstance(ledger.reserve(0, (1,), SHARE), Placement)
    assert ledger.view.gpu_tasks[0, 1] == 2
    ledger.check_invariants()
    whole = Request(cpu_milli=0, num_gpu=1, gpu_milli=1000, gpu_memory_bytes=16 * GiB)
    ledger._live[99] = Placement(node=0, gpus=(1,), request=whole, id=99)
    with pytest.raises(LedgerError) as broken:
        ledger.check_invariants()
    assert str(broken.value) == (
        "ledger invariant broken: free GPU, free GPU memory, GPU memory in 0..capacity, GPU task counts, "
        "GPU in 0..capacity, allocated total"
    )


def test_a_node_with_nothing_left_keeps_the_invariants() -> None:
    """Every CPU and byte of a node taken: free 0 is within 0..capacity, not broken."""
    ledger = two_nodes()
    assert isinstance(ledger.reserve(1, (), Request(cpu_milli=8_000, memory_bytes=32 * GiB)), Placement)
    assert (ledger.view.free_cpu_milli[1], ledger.view.free_memory_bytes[1]) == (0, 0)
    ledger.check_invariants()


def test_a_release_that_cannot_be_done_says_whether_it_was_never_reserved_or_is_not_held() -> None:
    """The message tells a placement built by hand (id -1) from one released already, the very first one
    (id 0) included."""
    ledger = two_nodes()
    first = ledger.reserve(0, (0,), SHARE)
    assert isinstance(first, Placement) and first.id == 0
    ledger.release(first)
    with pytest.raises(LedgerError) as twice:
        ledger.release(first)
    assert str(twice.value) == "cannot release placement 0 on node 0: it is not held (released twice?)"
    with pytest.raises(LedgerError) as never:
        ledger.release(Placement(node=1, gpus=(0,), request=SHARE))
    assert str(never.value) == "cannot release placement -1 on node 1: it was never reserved"
