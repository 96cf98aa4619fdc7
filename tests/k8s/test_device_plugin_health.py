"""Health sources of the device plugin: NVML XID events (through a fake pynvml), and the fake source."""

from __future__ import annotations

import collections
import time
import types
from dataclasses import dataclass

import pytest

from gpuslice.hardware.faults import FaultKind
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.node.gpu_faults import (
    APPLICATION_XIDS,
    FakeHealthSource,
    HealthChange,
    NoHealthChecks,
    NvmlHealthSource,
)
from gpuslice.units import GiB

NO_INSTANCE = 0xFFFFFFFF


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Event:
    device: str  # our fake handle is the GPU's UUID
    eventType: int
    eventData: int
    gpuInstanceId: int = NO_INSTANCE
    computeInstanceId: int = NO_INSTANCE


def fake_nvml(unsupported: tuple[str, ...] = (), broken: tuple[str, ...] = ()) -> types.SimpleNamespace:
    """Just the calls NvmlHealthSource makes; ``events`` is what nvmlEventSetWait_v2 returns next."""
    events: collections.deque[Event | NVMLError] = collections.deque()
    calls: list[str] = []

    def register(handle, mask, event_set):
        if handle in unsupported:
            raise NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
        if handle in broken:
            raise NVMLError(999)
        calls.append(f"register {handle} {mask}")

    def wait(event_set, timeout_ms):
        if not events:
            raise NVMLError(10)  # NVML_ERROR_TIMEOUT
        item = events.popleft()
        if isinstance(item, NVMLError):
            raise item
        return item

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_ERROR_NOT_SUPPORTED=3,
        NVML_ERROR_TIMEOUT=10,
        nvmlEventTypeSingleBitEccError=1,
        nvmlEventTypeDoubleBitEccError=2,
        nvmlEventTypeXidCriticalError=8,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlEventSetCreate=lambda: "set",
        nvmlEventSetFree=lambda s: calls.append("free"),
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
        nvmlDeviceGetSupportedEventTypes=lambda handle: 0b1011,
        nvmlDeviceRegisterEvents=register,
        nvmlEventSetWait_v2=wait,
        nvmlDeviceGetUUID=lambda handle: handle.encode(),
        events=events,
        calls=calls,
    )


def machine() -> Machine:
    return Machine("n", tuple(GpuInfo(i, f"GPU-{i}", "H100", 80 * GiB) for i in range(2)))


def test_nvml_source_registers_xid_and_ecc_events_for_every_gpu_and_releases_nvml():
    nvml = fake_nvml()
    source = NvmlHealthSource(machine(), nvml=nvml)
    source.close()
    assert nvml.calls == ["init", "register GPU-0 11", "register GPU-1 11", "free", "shutdown"]


def test_critical_xid_marks_its_gpu_unhealthy():
    nvml = fake_nvml()
    nvml.events.append(Event("GPU-1", 8, 79))  # XID 79: GPU has fallen off the bus
    source = NvmlHealthSource(machine(), nvml=nvml)
    assert source.wait(0.01) == [HealthChange("GPU-1", False, "XID 79", FaultKind.XID)]


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_leave_the_gpu_healthy(xid):
    nvml = fake_nvml()
    nvml.events.append(Event("GPU-0", 8, xid))
    assert NvmlHealthSource(machine(), nvml=nvml).wait(0.01) == []


def test_ecc_events_and_timeouts_are_not_changes():
    nvml = fake_nvml()
    nvml.events.append(Event("GPU-0", 1, 0))
    source = NvmlHealthSource(machine(), nvml=nvml)
    assert source.wait(0.01) == []
    assert source.wait(0.01) == []  # the queue is empty: NVML_ERROR_TIMEOUT


def test_xid_inside_a_mig_instance_marks_only_that_mig_device():
    nvml = fake_nvml()
    nvml.events.append(Event("GPU-0", 8, 94, gpuInstanceId=2, computeInstanceId=0))
    source = NvmlHealthSource(machine(), nvml=nvml, mig_devices={("GPU-0", 2, 0): "MIG-abc"})
    assert source.wait(0.01) == [HealthChange("MIG-abc", False, "XID 94", FaultKind.XID)]


def test_a_failing_event_wait_marks_every_gpu_unhealthy():
    nvml = fake_nvml()
    nvml.events.append(NVMLError(15))  # NVML_ERROR_UNKNOWN
    changes = NvmlHealthSource(machine(), nvml=nvml).wait(0.0)
    assert [(c.uuid, c.healthy) for c in changes] == [("GPU-0", False), ("GPU-1", False)]


def test_gpu_that_cannot_register_is_reported_unhealthy_unless_merely_too_old():
    nvml = fake_nvml(unsupported=("GPU-0",), broken=("GPU-1",))
    source = NvmlHealthSource(machine(), nvml=nvml)
    changes = source.wait(0.01)
    assert [(c.uuid, c.healthy) for c in changes] == [("GPU-1", False)]


def test_fake_source_returns_pushed_changes_in_order_in_one_batch():
    source = FakeHealthSource()
    source.set_health("GPU-0", False, "XID 48")
    source.set_health("GPU-0", True, "reset")
    assert source.wait(1.0) == [
        HealthChange("GPU-0", False, "XID 48", FaultKind.XID),
        HealthChange("GPU-0", True, "reset"),
    ]
    started = time.monotonic()
    assert source.wait(0.05) == [] and time.monotonic() - started >= 0.04


def test_no_health_checks_never_reports_a_change():
    assert NoHealthChecks().wait(0.01) == []
