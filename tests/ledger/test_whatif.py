"""A what-if row (``ledger.whatif.NodeRow``) changes exactly as the ledger does: taking a placement in a
what-if gives the row the ledger has after reserving it, giving it back the row after releasing it, and
the fit rule on a row answers what the ledger answers for that node."""

from __future__ import annotations

import random

import pytest

from gpuslice.hardware.mig import MigInstance, mig_gpu
from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger import FITS, Ledger, Placement, RefusalCode, code_number
from gpuslice.ledger.mig import mig_request
from gpuslice.ledger.whatif import NodeRow
from gpuslice.units import GiB
from gpuslice.workload.request import Request


def nodes() -> list[NodeSpec]:
    return [
        NodeSpec("a", 16_000, 64 * GiB, 4, "A100", gpu_memory_bytes=40 * GiB),
        NodeSpec("b", 8_000, 32 * GiB, 2, "V100", gpu_memory_bytes=16 * GiB),
    ]


def random_request(rng: random.Random) -> Request:
    cpu, memory = rng.choice([0, 500, 4_000]), rng.choice([0, GiB, 16 * GiB])
    if rng.random() < 0.5:  # a share
        milli, gpu_memory = rng.choice([1, 250, 700]), rng.choice([0, GiB, 10 * GiB])
        return Request(cpu, memory, 1, milli, gpu_memory_bytes=gpu_memory)
    return Request(cpu, memory, rng.choice([1, 2]), 1000)


def test_taking_and_giving_in_a_what_if_lands_where_reserve_and_release_land() -> None:
    """Random reserves and releases on a ledger; before each, the what-if of the same change on the row
    read before it. Every column (CPU, memory, per-GPU compute and memory) must agree."""
    rng = random.Random(7)
    ledger = Ledger(nodes())
    held: list[Placement] = []
    most = 0
    for _ in range(400):
        most = max(most, len(held))
        node = rng.randrange(2)
        if held and rng.random() < 0.4:
            placement = held.pop(rng.randrange(len(held)))
            before = ledger.row(placement.node)
            ledger.release(placement)
            assert before.given((placement,)) == ledger.row(placement.node)
            continue
        request = random_request(rng)
        gpus = rng.sample(range(nodes()[node].gpu_count), request.num_gpu)
        before = ledger.row(node)
        result = ledger.reserve(node, gpus, request)
        if isinstance(result, Placement):
            held.append(result)
            assert before.taken((result,)) == ledger.row(node)
        else:
            assert before == ledger.row(node)  # a refusal changes nothing
    assert most >= 4  # the walk held several at once, so rows were partly used


def test_the_fit_rule_on_a_row_answers_as_the_ledger_does_for_that_node() -> None:
    rng = random.Random(11)
    ledger = Ledger(nodes())
    agreed = {True: 0, False: 0}
    for _ in range(300):
        request = random_request(rng)
        fits = ledger.fits(request)
        allowed = ledger.model_allowed(request)
        for node in range(2):
            code = ledger.row(node).fit_code(request, bool(allowed[node]))
            assert (code == FITS) == bool(fits[node]), (request, node, code)
            agreed[code == FITS] += 1
        if rng.random() < 0.5:
            node = rng.randrange(2)
            gpus = rng.sample(range(nodes()[node].gpu_count), request.num_gpu)
            ledger.reserve(node, gpus, request)
    assert agreed[True] and agreed[False]  # both answers were reached


def test_rows_are_values_a_what_if_never_changes_the_row_it_started_from() -> None:
    ledger = Ledger(nodes())
    row = ledger.row(0)
    placement = Placement(0, (1, 2), Request(1000, GiB, 2, 1000))
    taken = row.taken((placement,))
    assert row == ledger.row(0)  # the row it came from is as it was
    assert taken.gpu_milli == (1000, 0, 0, 1000) and taken.cpu_milli == 15_000
    assert taken.memory_bytes == 63 * GiB
    assert taken.given((placement,)) == row
    with pytest.raises(AttributeError):
        row.cpu_milli = 0  # type: ignore[misc]


def test_a_mig_instance_taken_in_a_what_if_fills_its_slots_as_reserve_mig_does() -> None:
    table = mig_gpu("a100-80gb")
    spec = NodeSpec("m", 8_000, 32 * GiB, 2, "A100-80GB", gpu_memory_bytes=80 * GiB)
    ledger = Ledger([spec], mig={(0, 1): table})
    profile = table.profile("3g.40gb")
    request = mig_request(profile, 80 * GiB)
    mig_only = Request(0, mig_profile="3g.40gb")
    row = ledger.row(0)
    assert set(row.layouts) == {1} and row.mig_slot("3g.40gb")
    placements = []
    for start in (0, 4):
        before = ledger.row(0)
        placement = ledger.reserve_mig(0, 1, MigInstance(profile, start), request)
        assert isinstance(placement, Placement)
        assert before.taken((placement,)) == ledger.row(0)
        placements.append(placement)
    full = ledger.row(0)
    assert not full.mig_slot("3g.40gb")
    assert full.fit_code(mig_only, True) == code_number(RefusalCode.NO_MIG_SLOT)
    freed = full.given(placements[:1])
    assert freed.mig_slot("3g.40gb") and freed.fit_code(mig_only, True) == FITS
    ledger.release(placements[0])
    assert freed == ledger.row(0)


def test_a_row_read_from_columns_takes_the_nodes_own_gpu_count() -> None:
    ledger = Ledger(nodes())
    row = ledger.row(1)
    assert row == NodeRow(8_000, 32 * GiB, (1000, 1000), (16 * GiB, 16 * GiB), (16 * GiB, 16 * GiB))


def test_the_fit_rule_on_a_row_reads_its_cpu_and_memory_and_the_gpus_the_home_lets_it_use() -> None:
    """``NodeRow.fit_code`` passes the row's own CPU and host memory and the home's usable GPUs on to the
    rule: a request short of CPU or memory there is refused for it, and GPUs it may not use are not
    counted."""
    row = Ledger(nodes()).row(1)  # 8 CPUs, 32 GiB, two free 16 GiB GPUs
    whole = Request(1000, GiB, 1, 1000)
    assert row.fit_code(whole, True) == FITS
    assert row.fit_code(Request(9_000, GiB, 1, 1000), True) == code_number(RefusalCode.INSUFFICIENT_CPU)
    assert row.fit_code(Request(1000, 33 * GiB, 1, 1000), True) == code_number(
        RefusalCode.INSUFFICIENT_MEMORY
    )
    assert row.fit_code(whole, True, [False, True]) == FITS
    assert row.fit_code(whole, True, (False, False)) == code_number(RefusalCode.NO_USABLE_GPU)
    two = Request(1000, GiB, 2, 1000)
    assert row.fit_code(two, True, [True, False]) == code_number(RefusalCode.NO_USABLE_GPU)
    assert row.fit_code(whole, True, iter([False, True])) == FITS  # any iterable of flags, read once


def test_two_mig_instances_given_back_at_once_both_free_their_slots() -> None:
    """A what-if that gives back several MIG placements of one GPU in one call frees every one of them,
    as releasing each in turn does (the row's layouts are copied once, then changed by each)."""
    table = mig_gpu("a100-80gb")
    spec = NodeSpec("m", 8_000, 32 * GiB, 2, "A100-80GB", gpu_memory_bytes=80 * GiB)
    ledger = Ledger([spec], mig={(0, 0): table, (0, 1): table})
    profile = table.profile("7g.80gb")
    held = [
        ledger.reserve_mig(0, gpu, MigInstance(profile, 0), mig_request(profile, 80 * GiB)) for gpu in (0, 1)
    ]
    assert all(isinstance(p, Placement) for p in held)
    full = ledger.row(0)
    assert not full.mig_slot("7g.80gb")
    freed = full.given(held)
    for placement in held:
        ledger.release(placement)
    assert freed == ledger.row(0)
    assert all(layout.has_start("7g.80gb") for layout in freed.layouts.values())
    assert full.given(held).taken(held) == full  # and taking both back fills both again
