"""Tiny hand-built traces for the memory engine tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gpuslice.memory.workloads import Trace


def _hand_trace(rows: list[tuple[int, int]], tenants: list[int] | None = None) -> Trace:
    blocks = np.array([r[0] for r in rows])
    pages = np.array([r[1] for r in rows])
    tenant = np.array(tenants if tenants is not None else [0] * len(rows))
    return Trace.from_columns("hand", tenant, blocks, pages, np.zeros(len(rows)), np.arange(len(rows)))


@pytest.fixture
def hand_trace() -> Callable[..., Trace]:
    """hand_trace([(block, page), ...], tenants=None): one access per step, tenant 0 unless given."""
    return _hand_trace
