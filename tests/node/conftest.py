"""Fixtures for the node tests (helpers live in node_helpers.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from types import ModuleType

import pytest
from node_helpers import fake_pynvml

from gpuslice.node import launcher
from gpuslice.units import MiB


@pytest.fixture
def two_gpu_nvml() -> ModuleType:
    """Two H100s on one PCIe switch, MIG off, no processes."""
    return fake_pynvml(
        [
            {"name": "NVIDIA H100 80GB HBM3", "total": 81559 * MiB, "uuid": "GPU-aaaa", "mig": 0},
            {"name": "NVIDIA H100 80GB HBM3", "total": 81559 * MiB, "uuid": "GPU-bbbb", "mig": 0},
        ]
    )


@pytest.fixture
def cleanup():
    """Kill whatever group a test launched, even when it fails half-way."""
    groups: list[int] = []
    yield groups
    for pgid in groups:
        # the job's container first (its supervisor then records the exit and removes its cgroup)
        start = launcher.process_start(pgid)
        launcher.kill(pgid)
        deadline = time.monotonic() + 10
        while start is not None and launcher.is_alive(pgid, start) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
