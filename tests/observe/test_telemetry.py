"""GPU telemetry: the simulated model, and the NVML path through a fake pynvml and a fake fault source.

The NVML path cannot be exercised on a machine without an NVIDIA driver; these tests check what it
asks NVML and what it makes of the answers."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest

from gpuslice.hardware.faults import FaultKind, GpuFault
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.node.discovery import gpu_telemetry
from gpuslice.node.gpu_faults import FakeHealthSource
from gpuslice.node.telemetry import NvmlTelemetry, SimulatedTelemetry, SliceLoad
from gpuslice.units import GiB


def machine(model: str = "H100", n: int = 2) -> Machine:
    return Machine("t", tuple(GpuInfo(i, f"GPU-{i}", model, 80 * GiB) for i in range(n)))


def test_simulated_utilisation_adds_busy_shares_of_active_jobs_and_caps_at_one():
    readings = SimulatedTelemetry(machine()).read(
        [SliceLoad(0, 0.25), SliceLoad(0, 0.5), SliceLoad(0, 0.5, active=False), SliceLoad(1, 0.75),
         SliceLoad(1, 0.75)],
        {0: 3 * GiB},
    )  # fmt: skip
    assert [r.utilization_percent for r in readings] == [75.0, 100.0]
    assert [r.memory_used_bytes for r in readings] == [3 * GiB, 0]


def test_simulated_temperature_and_power_follow_utilisation_and_the_models_tdp():
    idle, busy = SimulatedTelemetry(machine("H100")).read([SliceLoad(1, 1.0)], {})
    assert (idle.temperature_celsius, idle.power_watts) == (32.0, 70.0)  # 10 % of 700 W
    assert (busy.temperature_celsius, busy.power_watts) == (72.0, 700.0)
    (l4,) = SimulatedTelemetry(machine("L4", 1)).read([SliceLoad(0, 0.5)], {})
    assert l4.temperature_celsius == 52.0 and l4.power_watts == pytest.approx(72 * 0.55)


def test_simulated_memory_never_exceeds_the_gpu():
    (r,) = SimulatedTelemetry(machine(n=1)).read([], {0: 500 * GiB})
    assert r.memory_used_bytes == 80 * GiB and r.faults == ()


class NVMLError(Exception):
    pass


def fake_nvml(samples: list[dict]) -> ModuleType:
    """One dict per GPU: util, used, temp, mw, ecc; a missing key answers NOT_SUPPORTED."""
    m = ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    m.NVML_VOLATILE_ECC = 0
    m.asked = []

    def field(name, make):
        def call(h, *args):
            m.asked.append((name, h, args))
            if name not in samples[h]:
                raise NVMLError("Not Supported")
            return make(samples[h][name])

        return call

    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(samples)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUtilizationRates = field("util", lambda v: SimpleNamespace(gpu=v, memory=0))
    m.nvmlDeviceGetMemoryInfo = field("used", lambda v: SimpleNamespace(used=v, total=80 * GiB))
    m.nvmlDeviceGetTemperature = field("temp", lambda v: v)
    m.nvmlDeviceGetPowerUsage = field("mw", lambda v: v)
    m.nvmlDeviceGetTotalEccErrors = field("ecc", lambda v: v)
    return m


def test_nvml_readings_convert_units_and_leave_unsupported_fields_empty():
    nvml = fake_nvml([{"util": 87, "used": 5 * GiB, "temp": 64, "mw": 312_500, "ecc": 0}, {"util": 3}])
    first, second = gpu_telemetry(nvml)
    assert (first.utilization_percent, first.memory_used_bytes) == (87.0, 5 * GiB)
    assert (first.temperature_celsius, first.power_watts, first.ecc_uncorrected) == (64.0, 312.5, 0)
    assert second.utilization_percent == 3.0
    assert (second.memory_used_bytes, second.temperature_celsius, second.power_watts) == (None, None, None)
    assert ("ecc", 0, (1, 0)) in nvml.asked  # uncorrected errors, volatile counter


def test_nvml_telemetry_reports_faults_from_the_source_and_from_rising_ecc_counts():
    samples = [{"util": 10, "ecc": 2}, {"util": 20, "ecc": 0}]
    source = FakeHealthSource()
    telemetry = NvmlTelemetry(machine(), source, nvml=fake_nvml(samples))
    first = telemetry.read([], {})
    assert [r.faults for r in first] == [(), ()]  # errors from before the server started are not news
    source.set_health("GPU-1", False, "XID 79")
    source.set_health("GPU-1", False, "XID 79")  # the same fault twice in one read: reported once
    source.set_health("GPU-9", False, "XID 79")  # not a GPU of this machine: ignored
    samples[0]["ecc"] = 5
    second = telemetry.read([], {})
    assert second[0].faults == (GpuFault(FaultKind.ECC, "uncorrected ECC errors rose from 2 to 5"),)
    assert second[1].faults == (GpuFault(FaultKind.XID, "XID 79"),)  # typed where it is seen
    assert [r.faults for r in telemetry.read([], {})] == [(), ()]


def test_nvml_telemetry_without_a_fault_source_still_reads():
    telemetry = NvmlTelemetry(machine(n=1), None, nvml=fake_nvml([{"util": 50}]))
    (r,) = telemetry.read([], {})
    assert r.utilization_percent == 50.0 and r.faults == ()
    telemetry.close()
