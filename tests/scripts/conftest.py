"""Fixtures of the GPU acceptance script's tests; the fakes themselves are in acceptance_helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from acceptance_helpers import dgx_h100_smi_at


@pytest.fixture
def dgx_h100_smi(tmp_path: Path) -> Path:
    """nvidia-smi of a DGX H100: eight H100 80GB HBM3 on NVSwitch."""
    return dgx_h100_smi_at(tmp_path)
