"""Helpers for the node tests: a condition poller, job specs, and a fake ``pynvml``.

The fake NVML answers the calls discovery, topology and the monitor make, for a small machine whose
GPUs are described as (name, total bytes, UUID, MIG mode or None when not supported, processes).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from gpuslice.workload.job import JobSpec

PY = sys.executable


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``condition`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)


def python_job(code: str, **fields: Any) -> JobSpec:
    """A JobSpec whose command runs ``code`` in this interpreter."""
    return JobSpec(command=(PY, "-c", code), **fields)


class FakeNVMLError(Exception):
    pass


def fake_pynvml(gpus: list[dict[str, Any]], *, init_fails: bool = False) -> ModuleType:
    """A module with the pynvml calls gpuslice.node uses. Each GPU dict: name, total, uuid, and
    optionally mig (current mode; absent = NOT_SUPPORTED), processes [(pid, bytes or None)],
    mig_devices [(uuid, profile_id, start)]."""
    m = ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    m.calls = {"init": 0, "shutdown": 0}

    def init() -> None:
        if init_fails:
            raise FakeNVMLError("Driver Not Loaded")
        m.calls["init"] += 1

    def shutdown() -> None:
        m.calls["shutdown"] += 1

    def mig_mode(h: int) -> tuple[int, int]:
        if "mig" not in gpus[h]:
            raise FakeNVMLError("Not Supported")
        return gpus[h]["mig"], gpus[h]["mig"]

    def processes(h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpus[h].get("processes", [])]

    def nvlink_state(h: int, link: int) -> int:
        raise FakeNVMLError("Not Supported")  # PCIe-only machine

    def mig_handle(h: int, k: int) -> tuple[int, int]:
        devices = gpus[h].get("mig_devices", [])
        if k >= len(devices):
            raise FakeNVMLError("Not Found")
        return (h, k)

    def gi_info(gi: tuple[int, int]) -> SimpleNamespace:
        _uuid, profile_id, start = gpus[gi[0]]["mig_devices"][gi[1]]
        return SimpleNamespace(profileId=profile_id, placement=SimpleNamespace(start=start), id=gi[1])

    m.nvmlInit = init
    m.nvmlShutdown = shutdown
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: gpus[h]["name"].encode()
    m.nvmlDeviceGetUUID = lambda h: (
        gpus[h]["uuid"] if isinstance(h, int) else gpus[h[0]]["mig_devices"][h[1]][0]
    )
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(
        total=gpus[h]["total"], used=0, free=gpus[h]["total"]
    )
    m.nvmlDeviceGetMigMode = mig_mode
    m.nvmlDeviceGetComputeRunningProcesses = processes
    m.nvmlDeviceGetPciInfo = lambda h: SimpleNamespace(busId=f"00000000:{0x10 + h:02X}:00.0".encode())
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 10  # NVML_TOPOLOGY_SINGLE: one PCIe switch
    m.nvmlDeviceGetNvLinkState = nvlink_state
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7
    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    m.nvmlDeviceGetGpuInstanceId = lambda device: device[1]
    m.nvmlDeviceGetGpuInstanceById = lambda parent, gi_id: (parent, gi_id)
    m.nvmlGpuInstanceGetInfo = gi_info
    return m
