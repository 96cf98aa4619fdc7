"""Per-GPU telemetry for the daemon: utilisation, memory used, temperature, power, and faults.

```text
NvmlTelemetry(machine, faults) real machine: NVML reads (discovery.gpu_telemetry); faults from a
                             fault source (serve passes node/gpu_faults.py's NvmlHealthSource: critical XID
                             events, application XIDs ignored) and from a rising uncorrected-ECC count
SimulatedTelemetry(machine)  --simulate: derived from the jobs placed on each GPU (see below)
read(loads, external) ──► [GpuReading per GPU]   (faults: what went wrong since the last read)
```

The simulated model (documented in docs/metrics.md, and nothing in it is measured):

- utilisation = min(1, Σ busy share of the running, not suspended jobs on the GPU), where a job's busy
  share is its compute allotment: 1 for a whole GPU, ``compute_percent`` / 100 for a share that gives one,
  memory slice / GPU memory for a memory-only share, compute slices / 7 for a MIG instance. A job is
  assumed to use what it was given: the fake load reports memory, not compute.
- memory used = the memory the jobs' fake loads report (node/monitor.py) + memory held outside gpuslice.
- temperature = 32 °C + (72 − 32) °C × utilisation, and power = TDP × (0.1 + 0.9 × utilisation): a
  linear steady state with no thermal lag. 32/72 °C and 10 % idle power are round figures typical of
  air-cooled data-centre GPUs, chosen for demos, not fitted to any measurement.

The NVML path cannot be exercised on a machine without an NVIDIA driver; its tests use a fake pynvml.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuslice.hardware.faults import FaultKind, GpuFault
from gpuslice.hardware.machine import Machine
from gpuslice.node import discovery

__all__ = [
    "IDLE_POWER_FRACTION",
    "IDLE_TEMPERATURE_CELSIUS",
    "LOAD_TEMPERATURE_CELSIUS",
    "TDP_WATTS",
    "FaultSource",
    "GpuReading",
    "NvmlTelemetry",
    "SimulatedTelemetry",
    "SliceLoad",
    "Telemetry",
    "simulated_power_watts",
    "simulated_temperature_celsius",
]

# Board power (TDP) by catalogue model, from NVIDIA's product datasheets: T4 70 W, P100 PCIe 250 W,
# V100 SXM2 300 W, A10 150 W, A100 SXM4 400 W, H100 SXM5 700 W, H200 SXM 700 W, L4 72 W. The
# Alibaba-internal G2/G3 (openb traces) have no public figure; DEFAULT_TDP_WATTS stands in.
TDP_WATTS: dict[str, float] = {
    "T4": 70.0,
    "P100": 250.0,
    "V100M16": 300.0,
    "V100M32": 300.0,
    "A10": 150.0,
    "A100-40GB": 400.0,
    "A100-80GB": 400.0,
    "H100": 700.0,
    "H200": 700.0,
    "L4": 72.0,
}
DEFAULT_TDP_WATTS = 250.0
IDLE_TEMPERATURE_CELSIUS = 32.0
LOAD_TEMPERATURE_CELSIUS = 72.0
IDLE_POWER_FRACTION = 0.1


@dataclass(frozen=True, slots=True)
class SliceLoad:
    """A running job's part of one GPU, as the simulated model needs it."""

    gpu: int
    busy_share: float  # 0..1: its compute allotment (see the module doc)
    active: bool = True  # False while suspended (SIGSTOP): it computes nothing


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU now. None where the source cannot say. ``faults``: new faults since the last read."""

    index: int
    utilization_percent: float | None
    memory_used_bytes: int | None
    temperature_celsius: float | None
    power_watts: float | None
    faults: tuple[GpuFault, ...] = ()


class Telemetry(Protocol):
    """What the daemon reads every monitor pass; ``simulated`` says whether the figures are modelled."""

    simulated: bool

    def read(self, loads: Sequence[SliceLoad], memory_used: Mapping[int, int]) -> list[GpuReading]: ...
    def close(self) -> None: ...


def simulated_temperature_celsius(utilization: float) -> float:
    return IDLE_TEMPERATURE_CELSIUS + (LOAD_TEMPERATURE_CELSIUS - IDLE_TEMPERATURE_CELSIUS) * utilization


def simulated_power_watts(model: str, utilization: float) -> float:
    tdp = TDP_WATTS.get(model, DEFAULT_TDP_WATTS)
    return tdp * (IDLE_POWER_FRACTION + (1 - IDLE_POWER_FRACTION) * utilization)


class SimulatedTelemetry:
    """The model of the module doc for a ``--simulate`` machine. Never reports a fault by itself:
    faults on a simulated GPU are injected (``POST /v1/gpus/{index}/health``)."""

    simulated = True

    def __init__(self, machine: Machine) -> None:
        self.machine = machine

    def read(self, loads: Sequence[SliceLoad], memory_used: Mapping[int, int]) -> list[GpuReading]:
        busy = [0.0] * self.machine.gpu_count
        for load in loads:
            if load.active:
                busy[load.gpu] += load.busy_share
        readings = []
        for gpu in self.machine.gpus:
            u = min(1.0, busy[gpu.index])
            readings.append(
                GpuReading(
                    index=gpu.index,
                    utilization_percent=round(100 * u, 3),
                    memory_used_bytes=min(gpu.memory_bytes, int(memory_used.get(gpu.index, 0))),
                    temperature_celsius=round(simulated_temperature_celsius(u), 3),
                    power_watts=round(simulated_power_watts(gpu.model, u), 3),
                )
            )
        return readings

    def close(self) -> None:
        return None


class FaultSource(Protocol):
    """Where GPU faults come from (``node.gpu_faults.HealthSource``): ``wait(0)`` returns what happened
    since the last call without blocking, as changes with a GPU ``uuid``, ``healthy`` and ``reason``."""

    def wait(self, timeout_s: float) -> list[Any]: ...
    def close(self) -> None: ...


# A fault source that keeps failing (a broken event set) answers every call; one read drains at most this.
_MAX_FAULTS_PER_READ = 64


class NvmlTelemetry:
    """Real readings through NVML; faults from ``faults`` and from a rising uncorrected-ECC count (an
    error from before the server started is not seen: the count is volatile since driver load, so only
    increases are faults). Without a fault source (event sets unsupported) only ECC counts mark GPUs."""

    simulated = False

    def __init__(self, machine: Machine, faults: FaultSource | None = None, nvml: Any | None = None) -> None:
        self.machine = machine
        self._nvml = nvml
        self._faults = faults
        self._index = {g.uuid: g.index for g in machine.gpus}
        self._ecc: dict[int, int] = {}

    def _new_faults(self) -> dict[int, list[GpuFault]]:
        faults: dict[int, list[GpuFault]] = {}
        for _ in range(_MAX_FAULTS_PER_READ if self._faults is not None else 0):
            assert self._faults is not None
            changes = self._faults.wait(0)
            if not changes:
                break
            for change in changes:
                gpu = self._index.get(change.uuid)
                fault = GpuFault(change.kind, change.reason)
                if gpu is not None and not change.healthy and fault not in faults.get(gpu, []):
                    faults.setdefault(gpu, []).append(fault)
        return faults

    def read(self, loads: Sequence[SliceLoad], memory_used: Mapping[int, int]) -> list[GpuReading]:
        faults = self._new_faults()
        readings = []
        for r in discovery.gpu_telemetry(self._nvml):
            if r.ecc_uncorrected is not None:
                before = self._ecc.get(r.index)
                if before is not None and r.ecc_uncorrected > before:
                    faults.setdefault(r.index, []).append(
                        GpuFault(
                            FaultKind.ECC, f"uncorrected ECC errors rose from {before} to {r.ecc_uncorrected}"
                        )
                    )
                self._ecc[r.index] = r.ecc_uncorrected
            readings.append(
                GpuReading(
                    index=r.index,
                    utilization_percent=r.utilization_percent,
                    memory_used_bytes=r.memory_used_bytes,
                    temperature_celsius=r.temperature_celsius,
                    power_watts=r.power_watts,
                    faults=tuple(faults.get(r.index, ())),
                )
            )
        return readings

    def close(self) -> None:
        if self._faults is not None:
            self._faults.close()
