"""ledger.ledger: columnar free capacity, changed only by validated reserve/release.

Cluster (conftest): 0 v100-a 4×V100M16, 1 v100-b 4×V100M16, 2 t4-c 2×T4, 3 cpu-d no GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from gpuslice.errors import LedgerError
from gpuslice.ledger.ledger import Ledger, LedgerView
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode, Unit
from gpuslice.units import GiB
from gpuslice.workload.request import Request

V100 = "V100M16"
T4 = "T4"
SHARE = Request(cpu_milli=1000, memory_bytes=GiB, num_gpu=1, gpu_milli=500)
WHOLE = Request(cpu_milli=1000, memory_bytes=GiB, num_gpu=1, gpu_milli=1000)
CPU_ONLY = Request(cpu_milli=1000, memory_bytes=GiB)
VIEW_ARRAYS = LedgerView.ARRAYS


def whole(n: int, models: tuple[str, ...] = ()) -> Request:
    return Request(cpu_milli=1000, memory_bytes=GiB, num_gpu=n, gpu_milli=1000, gpu_models=models)


def share(milli: int, models: tuple[str, ...] = ()) -> Request:
    return Request(cpu_milli=1000, memory_bytes=GiB, num_gpu=1, gpu_milli=milli, gpu_models=models)


def test_a_ledger_needs_at_least_one_node() -> None:
    with pytest.raises(ValueError, match=r"^a ledger needs at least one node$"):
        Ledger([])


def test_a_new_ledger_is_all_free_with_gpu_slots_past_the_count_at_zero(ledger: Ledger) -> None:
    view = ledger.view
    assert ledger.models == (T4, V100) == view.models  # a policy reads the models through the view
    np.testing.assert_array_equal(view.node_model, [1, 1, 0, 2])
    np.testing.assert_array_equal(view.free_cpu_milli, [32_000, 32_000, 16_000, 16_000])
    np.testing.assert_array_equal(view.free_gpu_milli[2], [1000, 1000, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(view.free_gpu_milli[3], np.zeros(8))
    assert ledger.total_gpu_milli == 10_000
    assert ledger.allocated_gpu_milli == 0
    assert ledger.live_placements == ()
    ledger.check_invariants()


# ---- fits --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("req", "expected"),
    [
        pytest.param(CPU_ONLY, [True, True, True, True], id="CPU-only fits everywhere"),
        pytest.param(Request(cpu_milli=20_000), [True, True, False, False], id="CPU beyond 16 cores"),
        pytest.param(Request(cpu_milli=0, memory_bytes=40 * GiB), [True, True, False, False], id="memory"),
        pytest.param(SHARE, [True, True, True, False], id="share on any GPU node"),
        pytest.param(share(500, (T4,)), [False, False, True, False], id="model constraint T4"),
        pytest.param(share(500, (V100, "A10")), [True, True, False, False], id="model list"),
        pytest.param(share(500, ("H100",)), [False, False, False, False], id="model nobody has"),
        pytest.param(whole(2), [True, True, True, False], id="two GPUs"),
        pytest.param(whole(3), [True, True, False, False], id="three GPUs beyond T4 count"),
        pytest.param(whole(4), [True, True, False, False], id="four GPUs"),
        pytest.param(whole(5), [False, False, False, False], id="five GPUs beyond every node"),
    ],
)
def test_fits_is_true_exactly_where_cpu_memory_model_and_gpu_count_allow(
    ledger: Ledger, req: Request, expected: list[bool]
) -> None:
    np.testing.assert_array_equal(ledger.fits(req), expected)
    np.testing.assert_array_equal(ledger.view.fits(req), expected)


def test_a_share_fits_on_a_partly_used_gpu_only_up_to_what_is_left(ledger: Ledger) -> None:
    assert isinstance(ledger.reserve(0, (0, 1, 2), whole(3)), Placement)
    assert isinstance(ledger.reserve(0, (3,), share(600)), Placement)
    np.testing.assert_array_equal(ledger.view.free_gpu_milli[0, :4], [0, 0, 0, 400])
    assert ledger.fits(share(400))[0]
    assert not ledger.fits(share(401))[0]
    assert not ledger.fits(whole(1))[0]


def test_fits_follows_cpu_already_taken(ledger: Ledger) -> None:
    assert isinstance(ledger.reserve(0, (), Request(cpu_milli=31_500)), Placement)
    assert not ledger.fits(SHARE)[0]
    assert ledger.fits(Request(cpu_milli=500, num_gpu=1, gpu_milli=500))[0]


# ---- reserve -----------------------------------------------------------------------------------------


def test_reserve_takes_cpu_memory_and_gpu_share_from_the_node(ledger: Ledger) -> None:
    placement = ledger.reserve(1, [2], share(300))
    assert isinstance(placement, Placement)
    assert (placement.node, placement.gpus, placement.request) == (1, (2,), share(300))
    assert placement.id >= 0
    view = ledger.view
    assert view.free_cpu_milli[1] == 31_000
    assert view.free_memory_bytes[1] == 63 * GiB
    np.testing.assert_array_equal(view.free_gpu_milli[1, :4], [1000, 1000, 700, 1000])
    np.testing.assert_array_equal(view.gpu_tasks[1, :4], [0, 0, 1, 0])
    assert ledger.allocated_gpu_milli == 300
    assert ledger.live_placements == (placement,)
    ledger.check_invariants()


def test_each_reservation_gets_its_own_id(ledger: Ledger) -> None:
    first = ledger.reserve(0, (0,), SHARE)
    second = ledger.reserve(0, (0,), SHARE)
    assert isinstance(first, Placement) and isinstance(second, Placement)
    assert first.id != second.id
    assert first != second


def test_a_cpu_only_reservation_takes_no_gpu(ledger: Ledger) -> None:
    placement = ledger.reserve(3, (), CPU_ONLY)
    assert isinstance(placement, Placement)
    assert ledger.allocated_gpu_milli == 0
    assert ledger.view.free_cpu_milli[3] == 15_000


# Pre-state for the refusal cases: node 0 GPU 1 has 700 milli taken (300 free).
REFUSALS = [
    pytest.param(4, (0,), SHARE, Refusal(RefusalCode.NO_SUCH_NODE, 4), id="node past the end"),
    pytest.param(-1, (0,), SHARE, Refusal(RefusalCode.NO_SUCH_NODE, -1), id="negative node"),
    pytest.param(
        0,
        (0,),
        Request(cpu_milli=40_000, num_gpu=1, gpu_milli=500),
        Refusal(
            RefusalCode.INSUFFICIENT_CPU, 0, need=40_000, free=31_000, capacity=32_000, unit=Unit.CPU_MILLI
        ),
        id="CPU",
    ),
    pytest.param(
        2,
        (),
        Request(cpu_milli=0, memory_bytes=40 * GiB),
        Refusal(
            RefusalCode.INSUFFICIENT_MEMORY,
            2,
            need=40 * GiB,
            free=32 * GiB,
            capacity=32 * GiB,
            unit=Unit.MEMORY,
        ),
        id="memory",
    ),
    pytest.param(0, (), SHARE, Refusal(RefusalCode.WRONG_GPU_COUNT, 0, need=1, free=0), id="no GPU given"),
    pytest.param(
        0, (0,), CPU_ONLY, Refusal(RefusalCode.WRONG_GPU_COUNT, 0, need=0, free=1), id="GPU for CPU-only"
    ),
    pytest.param(
        0, (0, 2), whole(3), Refusal(RefusalCode.WRONG_GPU_COUNT, 0, need=3, free=2), id="too few GPUs"
    ),
    pytest.param(
        0, (0,), share(500, (T4,)), Refusal(RefusalCode.GPU_MODEL_NOT_ALLOWED, 0), id="model excluded"
    ),
    pytest.param(3, (0,), SHARE, Refusal(RefusalCode.GPU_MODEL_NOT_ALLOWED, 3), id="CPU-only node"),
    pytest.param(0, (2, 2), whole(2), Refusal(RefusalCode.DUPLICATE_GPU, 0), id="same GPU twice"),
    pytest.param(2, (2,), SHARE, Refusal(RefusalCode.NO_SUCH_GPU, 2, gpu=2), id="padding slot"),
    pytest.param(0, (8,), SHARE, Refusal(RefusalCode.NO_SUCH_GPU, 0, gpu=8), id="GPU past the end"),
    pytest.param(0, (-1,), SHARE, Refusal(RefusalCode.NO_SUCH_GPU, 0, gpu=-1), id="negative GPU"),
    pytest.param(
        0,
        (1,),
        SHARE,
        Refusal(
            RefusalCode.INSUFFICIENT_GPU, 0, gpu=1, need=500, free=300, capacity=1000, unit=Unit.GPU_MILLI
        ),
        id="share on a fuller GPU",
    ),
    pytest.param(
        0,
        (0, 1),
        whole(2),
        Refusal(
            RefusalCode.INSUFFICIENT_GPU, 0, gpu=1, need=1000, free=300, capacity=1000, unit=Unit.GPU_MILLI
        ),
        id="whole GPU partly used",
    ),
]


@pytest.mark.parametrize(("node", "gpus", "req", "refusal"), REFUSALS)
def test_reserve_refuses_with_the_right_code_and_leaves_every_column_unchanged(
    ledger: Ledger,
    snapshot: Callable,
    same_state: Callable,
    node: int,
    gpus: tuple[int, ...],
    req: Request,
    refusal: Refusal,
) -> None:
    assert isinstance(ledger.reserve(0, (1,), share(700)), Placement)
    before = snapshot(ledger)
    result = ledger.reserve(node, gpus, req)
    assert result == refusal
    same_state(before, snapshot(ledger))
    assert ledger.check(node, gpus, req) == refusal
    ledger.check_invariants()


def test_check_says_none_when_reserve_would_succeed_and_changes_nothing(
    ledger: Ledger, snapshot: Callable, same_state: Callable
) -> None:
    before = snapshot(ledger)
    assert ledger.check(0, (0, 1), whole(2)) is None
    assert ledger.check(3, (), CPU_ONLY) is None
    same_state(before, snapshot(ledger))


@pytest.mark.parametrize(
    ("refusal", "text"),
    [
        (
            Refusal(
                RefusalCode.INSUFFICIENT_GPU, 0, gpu=1, need=500, free=300, capacity=1000, unit=Unit.GPU_MILLI
            ),
            "insufficient free GPU on node 0 GPU 1 (need 50 %, free 30 % of 100 % compute)",
        ),
        (Refusal(RefusalCode.NO_SUCH_NODE, 9), "no such node on node 9"),
        (
            Refusal(RefusalCode.INSUFFICIENT_CPU, 2, need=4000, free=0, capacity=16_000, unit=Unit.CPU_MILLI),
            "insufficient CPU on node 2 (need 4, free 0 of 16 CPU)",
        ),
        (
            Refusal(RefusalCode.INSUFFICIENT_GPU_MEMORY, 1, need=9 * GiB, free=-GiB, unit=Unit.GPU_MEMORY),
            "insufficient free GPU memory on node 1 (need 9 GiB, free 0 B GPU memory)",
        ),
    ],
)
def test_a_refusal_reads_as_reason_place_and_amounts(refusal: Refusal, text: str) -> None:
    assert str(refusal) == text


# ---- release -----------------------------------------------------------------------------------------


def test_release_gives_back_exactly_what_reserve_took(
    ledger: Ledger, snapshot: Callable, same_state: Callable
) -> None:
    before = snapshot(ledger)
    placement = ledger.reserve(0, (1, 3), whole(2))
    assert isinstance(placement, Placement)
    ledger.release(placement)
    after = snapshot(ledger)
    np.testing.assert_array_equal(after.pop("version"), [2, 0, 0, 0])
    before.pop("version")
    same_state(before, after)
    ledger.check_invariants()


def test_releasing_twice_raises_ledger_error_and_changes_nothing(
    ledger: Ledger, snapshot: Callable, same_state: Callable
) -> None:
    kept = ledger.reserve(0, (0,), SHARE)
    placement = ledger.reserve(0, (0,), SHARE)
    assert isinstance(kept, Placement) and isinstance(placement, Placement)
    ledger.release(placement)
    before = snapshot(ledger)
    with pytest.raises(LedgerError, match="released twice"):
        ledger.release(placement)
    same_state(before, snapshot(ledger))
    assert ledger.live_placements == (kept,)


def test_releasing_a_placement_that_was_never_reserved_raises(
    ledger: Ledger, snapshot: Callable, same_state: Callable
) -> None:
    before = snapshot(ledger)
    with pytest.raises(LedgerError, match="never reserved"):
        ledger.release(Placement(node=0, gpus=(0,), request=SHARE))
    same_state(before, snapshot(ledger))


def test_releasing_a_forged_placement_with_a_live_id_raises_and_keeps_the_real_one(
    ledger: Ledger, snapshot: Callable, same_state: Callable
) -> None:
    real = ledger.reserve(0, (0,), SHARE)
    assert isinstance(real, Placement)
    before = snapshot(ledger)
    with pytest.raises(LedgerError):
        ledger.release(Placement(node=0, gpus=(1,), request=SHARE, id=real.id))
    same_state(before, snapshot(ledger))
    assert ledger.live_placements == (real,)


# ---- the view ----------------------------------------------------------------------------------------


def test_the_view_declares_every_array_it_exposes(ledger: Ledger) -> None:
    exposed = {n for n in dir(ledger.view) if isinstance(getattr(ledger.view, n), np.ndarray)}
    assert set(LedgerView.ARRAYS) == exposed


@pytest.mark.parametrize("name", VIEW_ARRAYS)
def test_view_arrays_are_read_only(ledger: Ledger, name: str) -> None:
    array = getattr(ledger.view, name)
    with pytest.raises(ValueError, match="read-only"):
        array[0] = 0


def test_the_model_mask_handed_out_is_read_only(ledger: Ledger) -> None:
    mask = ledger.view.model_allowed(SHARE)
    with pytest.raises(ValueError, match="read-only"):
        mask[0] = False


def test_the_view_shows_the_current_state_without_being_rebuilt(ledger: Ledger) -> None:
    view = ledger.view
    assert isinstance(ledger.reserve(2, (1,), share(250)), Placement)
    assert view.free_gpu_milli[2, 1] == 750
    assert view.free_cpu_milli[2] == 15_000
    assert view.node_count == 4


# ---- why_not, version, invariants --------------------------------------------------------------------


def test_why_not_counts_each_nodes_first_failing_check(ledger: Ledger) -> None:
    assert isinstance(ledger.reserve(0, (0,), whole(1)), Placement)  # node 0: three GPUs left
    assert isinstance(ledger.reserve(1, (), Request(cpu_milli=20_000)), Placement)  # node 1: 12 cores left
    req = Request(cpu_milli=16_000, num_gpu=4, gpu_milli=1000, gpu_models=(V100,))
    assert not ledger.fits(req).any()
    # node 2 (T4) is also short of GPUs and CPU, but the model check comes first
    assert ledger.why_not(req) == Counter(
        {
            RefusalCode.GPU_MODEL_NOT_ALLOWED: 2,
            RefusalCode.INSUFFICIENT_GPU: 1,
            RefusalCode.INSUFFICIENT_CPU: 1,
        }
    )


def test_why_not_counts_only_the_nodes_that_fail(ledger: Ledger) -> None:
    req = Request(cpu_milli=20_000, memory_bytes=40 * GiB)
    assert ledger.why_not(req) == Counter({RefusalCode.INSUFFICIENT_CPU: 2})
    assert ledger.why_not(Request(cpu_milli=0, memory_bytes=40 * GiB)) == Counter(
        {RefusalCode.INSUFFICIENT_MEMORY: 2}
    )
    assert ledger.why_not(CPU_ONLY) == Counter()


def test_version_bumps_only_on_the_node_a_reservation_or_release_touches(ledger: Ledger) -> None:
    placement = ledger.reserve(1, (0,), SHARE)
    assert isinstance(placement, Placement)
    np.testing.assert_array_equal(ledger.view.version, [0, 1, 0, 0])
    assert isinstance(ledger.reserve(2, (0,), share(500, (V100,))), Refusal)
    np.testing.assert_array_equal(ledger.view.version, [0, 1, 0, 0])
    ledger.release(placement)
    np.testing.assert_array_equal(ledger.view.version, [0, 2, 0, 0])


def test_allocated_gpu_milli_and_live_placements_follow_reserve_and_release(ledger: Ledger) -> None:
    a = ledger.reserve(0, (0, 1), whole(2))
    b = ledger.reserve(2, (1,), share(250))
    assert isinstance(a, Placement) and isinstance(b, Placement)
    assert ledger.allocated_gpu_milli == 2250
    assert set(ledger.live_placements) == {a, b}
    ledger.release(a)
    assert ledger.allocated_gpu_milli == 250
    assert ledger.live_placements == (b,)


def test_check_invariants_catches_a_column_that_disagrees_with_the_placements(ledger: Ledger) -> None:
    assert isinstance(ledger.reserve(0, (0,), SHARE), Placement)
    ledger.check_invariants()
    ledger._free_gpu[0, 0] += 1  # corrupt on purpose: the checker must notice
    with pytest.raises(LedgerError, match="free GPU"):
        ledger.check_invariants()


def test_check_invariants_catches_a_wrong_allocated_total(ledger: Ledger) -> None:
    ledger.allocated_gpu_milli = 7
    with pytest.raises(LedgerError, match="allocated total"):
        ledger.check_invariants()
