"""Per-GPU memory and excluded GPU models: the ledger's columns for slices asked in bytes."""

import numpy as np
import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.hardware import NodeSpec
from gpuslice.ledger import Ledger, Placement, Refusal, RefusalCode
from gpuslice.units import GiB, MiB
from gpuslice.workload import Request

H100 = NodeSpec("h100", cpu_milli=64_000, memory_bytes=512 * GiB, gpu_count=2, gpu_model="H100")
L4 = NodeSpec("l4", cpu_milli=32_000, memory_bytes=128 * GiB, gpu_count=1, gpu_model="L4")


def slice_of(mem_gib: int, milli: int = 100, **kw) -> Request:
    return Request(cpu_milli=1000, num_gpu=1, gpu_milli=milli, gpu_memory_bytes=mem_gib * GiB, **kw)


def test_node_gpu_memory_defaults_to_the_catalogue_and_unknown_models_get_zero():
    assert H100.gpu_memory_bytes == 81559 * MiB
    assert NodeSpec("x", 1000, GiB, 1, "MysteryGPU").gpu_memory_bytes == 0


def test_a_slice_fits_only_where_a_single_gpu_has_the_memory():
    ledger = Ledger([H100, L4])
    assert ledger.fits(slice_of(20)).tolist() == [True, True]
    assert ledger.fits(slice_of(40)).tolist() == [True, False]  # an L4 has 22.5 GiB


def test_reserving_gpu_memory_reduces_that_gpu_only_and_release_restores_it():
    ledger = Ledger([H100])
    before = ledger.view.free_gpu_memory_bytes.copy()
    placement = ledger.reserve(0, (1,), slice_of(30))
    assert isinstance(placement, Placement)
    assert ledger.view.free_gpu_memory_bytes[0, 1] == before[0, 1] - 30 * GiB
    assert ledger.view.free_gpu_memory_bytes[0, 0] == before[0, 0]
    ledger.check_invariants()
    ledger.release(placement)
    np.testing.assert_array_equal(ledger.view.free_gpu_memory_bytes, before)


def test_a_gpu_short_of_memory_is_refused_with_its_own_code_and_nothing_changes():
    ledger = Ledger([H100])
    assert isinstance(ledger.reserve(0, (0,), slice_of(70)), Placement)
    before = ledger.view.free_gpu_memory_bytes.copy()
    refusal = ledger.reserve(0, (0,), slice_of(20))
    assert isinstance(refusal, Refusal)
    assert refusal.code is RefusalCode.INSUFFICIENT_GPU_MEMORY
    np.testing.assert_array_equal(ledger.view.free_gpu_memory_bytes, before)


def test_why_not_names_gpu_memory_when_compute_share_would_fit():
    ledger = Ledger([L4])
    assert ledger.why_not(slice_of(40))[RefusalCode.INSUFFICIENT_GPU_MEMORY] == 1


def test_excluded_models_are_never_feasible():
    ledger = Ledger([H100, L4])
    assert ledger.fits(slice_of(1, excluded_gpu_models=("H100",))).tolist() == [False, True]
    assert (
        ledger.why_not(slice_of(1, excluded_gpu_models=("H100", "L4")))[RefusalCode.GPU_MODEL_NOT_ALLOWED]
        == 2
    )


def test_a_model_both_required_and_excluded_is_rejected():
    with pytest.raises(InvalidRequest, match="both required and excluded"):
        slice_of(1, gpu_models=("L4",), excluded_gpu_models=("L4",))


def test_gpu_memory_without_gpus_is_rejected():
    with pytest.raises(InvalidRequest, match="num_gpu is 0"):
        Request(cpu_milli=100, gpu_memory_bytes=GiB)


def test_each_gpu_of_a_mixed_node_has_its_own_memory():
    """A node of a 16 GiB and a 40 GiB GPU: 24 GiB fits on GPU 1 only, and the columns hold each GPU's own
    capacity (slots past the node's GPUs hold 0)."""
    mixed = NodeSpec("mixed", 8_000, 32 * GiB, 2, "A100", gpu_memory_each=(16 * GiB, 40 * GiB))
    ledger = Ledger([mixed])
    assert ledger.view.gpu_memory_capacity_bytes[0].tolist() == [16 * GiB, 40 * GiB] + [0] * 6
    slice_24 = Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=24 * GiB)
    assert ledger.reserve(0, (0,), slice_24).code is RefusalCode.INSUFFICIENT_GPU_MEMORY
    assert isinstance(ledger.reserve(0, (1,), slice_24), Placement)
    assert ledger.view.free_gpu_memory_bytes[0, :2].tolist() == [16 * GiB, 16 * GiB]


def test_every_column_is_exact_int64():
    """Capacities and free amounts are whole numbers (bytes, milli) kept exactly, as int64, whatever the
    node: a float column would round memory past 2**53 bytes."""
    node = NodeSpec("big", 8_000, 2**60 + 1, 2, "A100", gpu_memory_bytes=80 * GiB)
    ledger = Ledger([node, NodeSpec("cpu", 4_000, GiB, 0, "")])
    view = ledger.view
    assert {name: getattr(view, name).dtype for name in view.ARRAYS} == dict.fromkeys(view.ARRAYS, np.int64)
    assert isinstance(ledger.reserve(0, (), Request(cpu_milli=0, memory_bytes=1)), Placement)
    assert int(view.free_memory_bytes[0]) == 2**60
