"""HealthBook: which marks change a GPU's health, and what they record."""

from __future__ import annotations

from gpuslice.hardware.faults import FaultKind
from gpuslice.observe.health import GpuHealth, HealthBook


def test_gpus_start_healthy():
    book = HealthBook(2)
    assert book[0] == GpuHealth() and book.unhealthy() == {}


def test_a_fault_marks_the_gpu_unhealthy_with_reason_kind_and_time():
    book = HealthBook(4)
    change = book.mark(3, False, "XID 79", 100.0, kind=FaultKind.XID)
    assert change is not None and change.before.healthy and not change.after.healthy
    assert book[3] == GpuHealth(False, "XID 79", "xid", 100.0)
    assert set(book.unhealthy()) == {3}


def test_the_same_fault_again_is_not_a_change_but_a_new_one_is_and_keeps_the_first_time():
    book = HealthBook(1)
    book.mark(0, False, "XID 79", 100.0, kind=FaultKind.XID)
    assert book.mark(0, False, "XID 79", 105.0, kind=FaultKind.XID) is None
    change = book.mark(0, False, "uncorrected (double-bit) ECC error", 110.0, kind=FaultKind.ECC)
    assert change is not None and change.after.kind == "ecc" and change.after.since == 100.0


def test_a_manual_mark_is_kind_manual_even_when_it_names_an_xid():
    book = HealthBook(1)
    book.mark(0, False, "XID 79", 1.0, kind=FaultKind.MANUAL)
    assert book[0].kind == "manual"


def test_marking_healthy_clears_it_once():
    book = HealthBook(1)
    assert book.mark(0, True, "", 1.0, kind=FaultKind.MANUAL) is None  # already healthy: nothing to do
    book.mark(0, False, "", 2.0, kind=FaultKind.MANUAL)
    assert book[0].reason == "marked unhealthy"  # an empty reason gets a default text
    change = book.mark(0, True, "", 3.0, kind=FaultKind.MANUAL)
    assert change is not None and change.after == GpuHealth()
