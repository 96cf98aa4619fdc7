"""Fixtures for the node tests (helpers live in node_helpers.py)."""

from __future__ import annotations

from types import ModuleType

import pytest
from node_helpers import fake_pynvml

from gpuslice.units import MiB
from job_cleanup import end_job


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
        end_job(pgid)
