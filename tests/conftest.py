"""Shared fixtures: a small hand-built cluster, ledger snapshots, and placers over any policy.

The cluster (ledger order; ``ledger.models`` is ("T4", "V100M16")):

| index | name   | CPU      | memory | GPUs        |
|------:|--------|---------:|-------:|-------------|
| 0     | v100-a | 32 cores | 64 GiB | 4 × V100M16 |
| 1     | v100-b | 32 cores | 64 GiB | 4 × V100M16 |
| 2     | t4-c   | 16 cores | 32 GiB | 2 × T4      |
| 3     | cpu-d  | 16 cores | 32 GiB | none        |
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import psutil
import pytest

from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger.ledger import Ledger, LedgerView
from gpuslice.ledger.placement import Placement
from gpuslice.policies import PolicyContext, make_policy
from gpuslice.scheduler.placer import Placer
from gpuslice.units import GiB
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload


def _job_cgroups() -> set[Path]:
    """Every job cgroup on this machine (node/containment: gpuslice-<supervisor pid>-<hex>)."""
    found: set[Path] = set()
    root = Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError):
        for hierarchy in [root, *root.iterdir()]:
            for parent in (hierarchy, *hierarchy.glob("*/*")):  # beside the test's own cgroup (v1 memory)
                found.update(parent.glob("gpuslice-[0-9]*-*"))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie has ended (where PID 1 reaps orphans, as on CI, it is soon gone;
    where it does not, it would hide a supervisor that died)."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


@pytest.fixture(autouse=True)
def no_cgroup_left_behind():
    """A test leaves no job cgroup behind whose supervisor has ended (each is removed by its supervisor
    or, once that is gone, by the kill that empties it). One that is left is removed and named."""
    before = _job_cgroups()
    yield
    left = []
    for path in _job_cgroups() - before:
        if not _running(int(path.name.split("-")[1])):
            left.append(path)
            with contextlib.suppress(OSError):
                path.rmdir()
    assert not left, f"job cgroups left behind: {sorted(map(str, left))}"


V100 = "V100M16"
T4 = "T4"

VIEW_ARRAYS = LedgerView.ARRAYS


def _small_nodes() -> list[NodeSpec]:
    return [
        NodeSpec("v100-a", 32_000, 64 * GiB, 4, V100),
        NodeSpec("v100-b", 32_000, 64 * GiB, 4, V100),
        NodeSpec("t4-c", 16_000, 32 * GiB, 2, T4),
        NodeSpec("cpu-d", 16_000, 32 * GiB, 0, ""),
    ]


@pytest.fixture
def small_nodes() -> list[NodeSpec]:
    return _small_nodes()


@pytest.fixture
def ledger(small_nodes: list[NodeSpec]) -> Ledger:
    return Ledger(small_nodes)


@pytest.fixture
def mixed_requests() -> list[Request]:
    """A batch with every kind of request; in this order it fits on the empty small cluster wherever
    each one goes (the T4 whole GPU comes first, so nothing can take both T4s before it)."""
    return [
        Request(cpu_milli=4_000, memory_bytes=8 * GiB, num_gpu=1, gpu_milli=1000, gpu_models=(T4,)),
        Request(cpu_milli=4_000, memory_bytes=8 * GiB, num_gpu=1, gpu_milli=500),
        Request(cpu_milli=2_000, memory_bytes=4 * GiB, num_gpu=1, gpu_milli=300),
        Request(cpu_milli=8_000, memory_bytes=16 * GiB, num_gpu=2, gpu_milli=1000),
        Request(cpu_milli=1_000, memory_bytes=1 * GiB),
        Request(cpu_milli=2_000, memory_bytes=2 * GiB, num_gpu=1, gpu_milli=250, gpu_models=(V100,)),
        Request(cpu_milli=4_000, memory_bytes=8 * GiB, num_gpu=1, gpu_milli=500),
        Request(cpu_milli=500, memory_bytes=1 * GiB),
    ]


@pytest.fixture
def mixed_target(mixed_requests: list[Request]) -> TargetWorkload:
    return TargetWorkload.from_requests(mixed_requests)


Snapshot = dict[str, object]


def snapshot_of(ledger: Ledger) -> Snapshot:
    """Copies of every column plus the scalar state, to compare before and after an operation."""
    state: Snapshot = {name: getattr(ledger.view, name).copy() for name in VIEW_ARRAYS}
    state["allocated_gpu_milli"] = ledger.allocated_gpu_milli
    state["live"] = ledger.live_placements
    return state


def assert_same_state(before: Snapshot, after: Snapshot) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, after[key], err_msg=key)
        else:
            assert value == after[key], key


@pytest.fixture
def snapshot() -> Callable[[Ledger], Snapshot]:
    return snapshot_of


@pytest.fixture
def same_state() -> Callable[[Snapshot, Snapshot], None]:
    return assert_same_state


@pytest.fixture
def make_placer() -> Callable[..., Placer]:
    """make_placer(ledger, "fgd", target=..., seed=0): a Placer running a registered policy."""

    def build(ledger: Ledger, name: str, target: TargetWorkload | None = None, seed: int = 0) -> Placer:
        context = PolicyContext(rng=np.random.default_rng(seed), target=target)
        return Placer(ledger, make_policy(name, ledger.view, context))

    return build


@pytest.fixture
def occupy() -> Callable[[Placer, int, Sequence[int], Request], Placement]:
    """occupy(placer, node, gpus, req): set up a state by hand, telling the policy as the placer would."""

    def reserve(placer: Placer, node: int, gpus: Sequence[int], req: Request) -> Placement:
        placement = placer.ledger.reserve(node, gpus, req)
        assert isinstance(placement, Placement), placement
        placer.policy.on_placed(placer.ledger.view, placement)
        return placement

    return reserve


@pytest.fixture
def external_tool() -> Callable[[str, str], str]:
    """external_tool("promtool", "apt install prometheus") -> the program's path. Missing, the test is
    skipped, unless GPUSLICE_REQUIRE_EXTERNAL is set (CI installs these programs), where it fails."""

    def find(name: str, install: str) -> str:
        found = shutil.which(name) or shutil.which(f"/usr/bin/{name}")
        if found is not None:
            return found
        if os.environ.get("GPUSLICE_REQUIRE_EXTERNAL"):
            pytest.fail(f"GPUSLICE_REQUIRE_EXTERNAL is set but {name} is missing ({install})")
        pytest.skip(f"{name} is not installed ({install})")

    return find


@pytest.fixture
def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[[list[str]], tuple[int, str, str]]:
    """run_cli(args) -> (exit code, stdout, stderr) of ``gpuslice ARGS`` as the installed command runs
    (``main``: a UserError is one error line and exit 2), 200 columns wide so tables are not cut."""
    from gpuslice.cli.main import main

    def run(args: list[str]) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["gpuslice", *args])
        monkeypatch.setenv("COLUMNS", "200")
        with pytest.raises(SystemExit) as stopped:
            main()
        captured = capsys.readouterr()
        return stopped.value.code, captured.out, captured.err

    return run
