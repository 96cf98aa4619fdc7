"""Shared checks for policy files: did two runs decide the same? And the built-ins written as files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builtin_exports import write_builtin_files

from gpuslice.sim.trace import NODE_FILE, OpenbTrace, load_trace


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


# A small openb-format cluster and pod list: shares and whole GPUs on 24 nodes of 1-8 GPUs.
NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n-{i},32000,131072,{1 + i % 8},V100M16\n" for i in range(24)
)
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
    f"p-{i},{1000 + 500 * (i % 5)},1024,1,{100 * (1 + i % 9)}\n"  # shares
    if i % 4
    else f"p-{i},{1000 + 500 * (i % 5)},1024,{1 + i % 3},1000\n"  # whole GPUs
    for i in range(120)
)


@pytest.fixture
def small(tmp_path: Path) -> OpenbTrace:
    (tmp_path / NODE_FILE).write_text(NODES)
    (tmp_path / "openb_pod_list_small.csv").write_text(PODS)
    return load_trace("small", tmp_path)
