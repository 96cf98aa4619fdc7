"""Shared checks for policy files: did two runs decide the same? And the built-ins written as files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builtin_exports import write_builtin_files


def _same_replay(a: Any, b: Any) -> bool:
    """Two openb replays placed every pod alike (allocation and fragmentation after every arrival)."""
    return (
        a.failed_pods == b.failed_pods
        and np.array_equal(a.allocated_gpu_milli, b.allocated_gpu_milli)
        and np.array_equal(a.fragmented_gpu_milli, b.fragmented_gpu_milli)
    )


def _memsim_outcome(r: Any) -> tuple[Any, ...]:
    """What a memory policy decides: every count, the policy requests, and the estimated time of a run."""
    return (
        r.faults, r.chunk_faults, r.evictions, r.migrated_bytes, r.evicted_bytes, r.thrashing_events,
        r.requests, r.estimated_seconds,
    )  # fmt: skip


@pytest.fixture
def same_replay() -> Callable[[Any, Any], bool]:
    return _same_replay


@pytest.fixture
def memsim_outcome() -> Callable[[Any], tuple[Any, ...]]:
    return _memsim_outcome


@pytest.fixture(scope="session")
def builtin_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with built-in policies exported as files (``builtin_exports.EXPORTED``)."""
    return write_builtin_files(tmp_path_factory.mktemp("builtin_files"))
