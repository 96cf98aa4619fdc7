"""Built-in policies written as policy files (``gpuslice policy export``) decide exactly as the built-ins:
verifying, loading and guarding a policy leaves its decisions alone. And the examples run.

Placement: an openb replay per policy on a small trace made from the bundled default trace. Queue: the
order of random pending sets. Memory: memsim runs with the hooks visible ("full"), so the access hooks
fire too.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from gpuslice.memory import SimConfig, make_workload, simulate
from gpuslice.memory.hooks import Composed
from gpuslice.memory.policies import EVICTION, PREFETCH
from gpuslice.policies.queue import QUEUE
from gpuslice.policies.queue.base import QueuedJob, QueueView, order_pending
from gpuslice.programs.guard import guard
from gpuslice.programs.loader import load_file
from gpuslice.sim.openb import replay
from gpuslice.sim.trace import NODE_FILE, OpenbTrace, load_trace
from gpuslice.workload.job import JobSpec, Priority

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples/policies"
DATA = ROOT / "src/gpuslice/data/openb"


@pytest.fixture(scope="module")
def openb_sample(tmp_path_factory: pytest.TempPathFactory) -> OpenbTrace:
    """120 nodes and 900 pods of the bundled default trace (every node model and pod shape kind)."""
    folder = tmp_path_factory.mktemp("openb")
    nodes = (DATA / NODE_FILE).read_text().splitlines()
    pods = (DATA / "openb_pod_list_default.csv").read_text().splitlines()
    (folder / NODE_FILE).write_text("\n".join(nodes[:1] + nodes[1::10]) + "\n")
    (folder / "openb_pod_list_sample.csv").write_text("\n".join(pods[:1] + pods[1::9]) + "\n")
    return load_trace("sample", folder)


@pytest.mark.parametrize(("builtin", "file"), [("fgd", "fgd.py"), ("bestfit", "bestfit.py")])
@pytest.mark.parametrize("seed", [42, 43])
def test_placement_file_replays_exactly_as_the_builtin(
    openb_sample: OpenbTrace, builtin: str, file: str, seed: int, same_replay: Any, builtin_files: Path
) -> None:
    ours = replay(openb_sample, builtin, seed)
    loaded = replay(openb_sample, str(builtin_files / file), seed)
    assert ours.failed_pods > 0 and len(ours.allocated_gpu_milli) > 500  # the sample is under pressure
    assert same_replay(loaded, ours)
    assert loaded.fallbacks == {}


def test_placement_example_places_every_pod_it_can(openb_sample: OpenbTrace) -> None:
    spread = replay(openb_sample, str(EXAMPLES / "least_loaded.py"), 42)
    packed = replay(openb_sample, "bestfit", 42)
    assert spread.fallbacks == {} and len(spread.allocated_gpu_milli) == len(packed.allocated_gpu_milli)
    # spreading fragments the cluster: it strands more GPU than packing does
    assert spread.unallocated_pct_at(100) > packed.unallocated_pct_at(100)


def random_jobs(rng: random.Random, now: float) -> list[QueuedJob]:
    jobs = []
    for seq in range(30):
        spec = JobSpec(
            command=("true",),
            gpus=rng.choice([1, 1, 2, 4]),
            priority=rng.choice(list(Priority)),
            tenant=rng.choice(["a", "b", "c"]),
        )
        jobs.append(QueuedJob(f"j{seq}", spec, now - rng.uniform(0, 4000), seq))
    rng.shuffle(jobs)
    return jobs


@pytest.mark.parametrize(
    ("builtin", "file"), [("fifo", "fifo_queue.py"), ("priority-fair", "priority_fair.py")]
)
def test_queue_file_orders_exactly_as_the_builtin(builtin: str, file: str, builtin_files: Path) -> None:
    loaded = load_file(builtin_files / file)
    ours, theirs = QUEUE[builtin](), guard("queue", loaded.instantiate(), QUEUE["fifo"]())
    rng = random.Random(7)
    for _ in range(20):
        view = QueueView(now=5000.0, tenant_weight={"a": 2.0}, tenant_gpus={"a": 3.0, "b": 1.5})
        jobs = random_jobs(rng, view.now)
        assert order_pending(theirs, view, jobs) == order_pending(ours, view, jobs)
    assert theirs.guard.faults == {}


def test_queue_example_puts_small_jobs_first_and_reads_its_boost_map() -> None:
    loaded = load_file(EXAMPLES / "small_first.py")
    maps = loaded.new_maps()
    ops = guard("queue", loaded.instantiate(maps=maps), QUEUE["fifo"]())
    view = QueueView(now=0.0)
    big = QueuedJob("big", JobSpec(command=("x",), gpus=4, tenant="bob"), 0.0, 0)
    small = QueuedJob("small", JobSpec(command=("x",), gpus=1, tenant="alice"), 0.0, 1)
    share = QueuedJob("share", JobSpec(command=("x",), gpus=1, compute_percent=25, tenant="bob"), 0.0, 2)
    assert [j.job_id for j in order_pending(ops, view, [big, small, share])] == ["share", "small", "big"]
    maps["boost"].update("bob", 1)  # what `gpuslice policy map update boost bob 1` does
    assert [j.job_id for j in order_pending(ops, view, [big, small, share])] == ["share", "big", "small"]


@pytest.mark.parametrize(("builtin", "file"), [("lfu", "lfu.py"), ("fifo", "fifo_evict.py")])
@pytest.mark.parametrize("workload", ["gemm", "hotspot"])
def test_eviction_file_simulates_exactly_as_the_builtin(
    builtin: str, file: str, workload: str, memsim_outcome: Any, builtin_files: Path
) -> None:
    trace = make_workload(workload, scale=0.02, seed=3)
    cfg = SimConfig(oversub=1.5, visibility="full")
    ours = simulate(trace, Composed(EVICTION[builtin](), PREFETCH["tree"]()), cfg)
    ops = guard("eviction", load_file(builtin_files / file).instantiate(), EVICTION["default"]())
    theirs = simulate(trace, Composed(ops, PREFETCH["tree"]()), cfg)
    assert ours.evictions > 0
    assert memsim_outcome(theirs) == memsim_outcome(ours) and ops.guard.faults == {}


@pytest.mark.parametrize("workload", ["gemm", "hotspot"])
def test_prefetch_file_simulates_exactly_as_the_builtin(
    workload: str, memsim_outcome: Any, builtin_files: Path
) -> None:
    trace = make_workload(workload, scale=0.02, seed=3)
    cfg = SimConfig(oversub=1.5)
    ours = simulate(trace, Composed(EVICTION["lfu"](), PREFETCH["stride"]()), cfg)
    ops = guard("prefetch", load_file(builtin_files / "stride.py").instantiate(), PREFETCH["tree"]())
    theirs = simulate(trace, Composed(EVICTION["lfu"](), ops), cfg)
    assert memsim_outcome(theirs) == memsim_outcome(ours) and ops.guard.faults == {}


def test_eviction_example_keeps_refaulted_blocks_in_its_map() -> None:
    trace = make_workload("hotspot", scale=0.02, seed=3)
    loaded = load_file(EXAMPLES / "refault_protect.py")
    maps = loaded.new_maps()
    ops = guard("eviction", loaded.instantiate(maps=maps), EVICTION["default"]())
    result = simulate(trace, Composed(ops, PREFETCH["tree"]()), SimConfig(oversub=1.5))
    counts = dict(maps["activations"].dump())
    assert len(counts) == trace.working_set_blocks and result.requests["APPLY"] == sum(counts.values())
    assert max(counts.values()) > 1  # blocks came back after eviction and were protected
    assert ops.guard.faults == {}
