"""The hostile corpus (``tests/programs/hostile/``): policy files that try to hurt the process running
them. Each file says what should happen in its docstring (``expect: timeout``, ``memory``, ``invalid``,
``exception`` or ``rejected``; "or" between two when either can come first on a busy machine).

A file the verifier should refuse is refused. Every other file runs in its worker process: in a policy
slot (queue files), in ``sim openb``'s replay (placement files) and in a real ``gpuslice serve``
(``test_serve_hostile.py``). The assertions: the built-in decides instead (the same order, the same
replay as with a harmless file), the fault is counted with the kind the file provokes, and this process
neither froze nor grew.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuslice.policies.queue import QUEUE
from gpuslice.policies.queue.base import QueuedJob, QueueView, order_pending
from gpuslice.programs.guard import GuardConfig
from gpuslice.programs.loader import PolicyRejected, load_file
from gpuslice.programs.slot import PolicySlot
from gpuslice.sim.openb import replay
from gpuslice.workload.job import JobSpec, Priority

HOSTILE = Path(__file__).parent / "hostile"
FILES = sorted(HOSTILE.glob("*.py"))
SLACK_BYTES = 100 * 2**20  # what this process may grow by while a hostile file runs
HARMLESS = """\
from gpuslice.programs.api import PlacementOps


class Harmless(PlacementOps):
    name = "harmless"
"""


def expected(path: Path) -> set[str]:
    """The fault kinds the file's docstring names (``expect: memory or timeout``)."""
    (line,) = [line for line in path.read_text().splitlines() if line.startswith("expect:")]
    return {word for word in line.split()[1:] if word != "or"}


def of_kind(kind: str, prefix: str) -> list[Any]:
    return [
        pytest.param(p, id=p.stem) for p in FILES if p.stem.startswith(prefix) and kind not in expected(p)
    ]


def fault_kinds(fallbacks: dict[str, int]) -> set[str]:
    """The kinds of a run's faults, an overrun (a call that kept the GIL past its budget and then returned,
    judged when it returned) counted as the timeout it is (a call stuck longer is killed: "timeout")."""
    return {"timeout" if kind == "overrun" else kind for kind in (k.rpartition(":")[2] for k in fallbacks)}


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_the_corpus_has_at_least_thirty_files_each_with_an_expectation() -> None:
    assert len(FILES) >= 30
    kinds = {"timeout", "memory", "invalid", "exception", "rejected"}
    for path in FILES:
        assert expected(path) and expected(path) <= kinds, path.name


@pytest.mark.parametrize("path", [p for p in FILES if "rejected" in expected(p)], ids=lambda p: p.stem)
def test_a_file_that_reaches_outside_is_refused_by_the_verifier(path: Path) -> None:
    with pytest.raises(PolicyRejected):
        load_file(path)


class Ticker:
    """A thread that wakes every 10 ms and records how late it woke: a hook holding the GIL in this
    process would show here as a gap of its whole run."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            time.sleep(0.01)
            self.worst = max(self.worst, time.perf_counter() - started - 0.01)

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("path", of_kind("rejected", "q_"))
def test_a_hostile_queue_file_costs_a_fault_and_the_builtin_orders_the_queue(path: Path) -> None:
    events: list[str] = []
    slot = PolicySlot("queue", QUEUE["priority-fair"], GuardConfig(budget_seconds=0.2), events.append)
    slot.swap(load_file(path))
    jobs = [
        QueuedJob(f"j{i}", JobSpec(command=("x",), priority=Priority(i % 3)), float(i), i) for i in range(6)
    ]
    default_order = order_pending(QUEUE["priority-fair"](), QueueView(now=10.0), jobs)
    before = rss_bytes()
    try:
        with Ticker() as ticker, slot.lock:
            order = order_pending(slot.current, QueueView(now=10.0), jobs)
    finally:
        slot.close()
    assert order == default_order
    faults = slot.info()["faults"]
    assert {key.partition(":")[2] for key in faults} & expected(path), faults
    assert any("the default decided" in e for e in events)
    # The hook ran elsewhere: this process's threads kept running, and its memory stayed.
    assert ticker.worst < 1.0, f"this process stalled {ticker.worst:.2f} s while the hook ran"
    assert rss_bytes() - before < SLACK_BYTES


@pytest.mark.parametrize("path", of_kind("rejected", "p_"))
def test_a_hostile_placement_file_in_a_replay_leaves_every_decision_to_the_builtin(
    path: Path, small: Any, same_replay: Any, tmp_path: Path
) -> None:
    config = GuardConfig(budget_seconds=0.3, max_faults=3, abandon=False)
    before = rss_bytes()
    with Ticker() as ticker:
        result = replay(small, str(path), 42, guard_config=config)
    harmless = tmp_path / "harmless.py"  # the base class's hooks only: what the guard falls back to
    harmless.write_text(HARMLESS)
    baseline = replay(small, str(harmless), 42, guard_config=config)
    assert same_replay(result, baseline)  # the default decided every pod
    kinds = fault_kinds(result.fallbacks)
    assert kinds & expected(path), result.fallbacks
    assert kinds <= expected(path) | {"restarting"}, result.fallbacks
    assert result.fell_back_pods > 0
    assert ticker.worst < 1.0, f"this process stalled {ticker.worst:.2f} s while the hook ran"
    assert rss_bytes() - before < SLACK_BYTES


FAILS_TO_RESTART = """\
from gpuslice.programs.api import Map, QueueOps


class FailsToRestart(QueueOps):
    name = "fails-to-restart"
    seen = Map(key=str, value=int, max_entries=4)

    def __init__(self) -> None:
        super().__init__()
        if self.seen.get("calls", 0) > 0:
            raise ValueError("cannot start again")

    def order_key(self, view, job):
        if self.seen.get("calls", 0) > 0:
            return (sum(range(10**10)),)
        self.seen.update("calls", 1)
        return (0,)
"""


def test_a_worker_that_cannot_build_the_policy_again_after_a_kill_is_a_fault_and_detaches(tmp_path) -> None:
    """The first call leaves a map entry and succeeds; the second runs past its budget and the worker is
    killed; the fresh worker builds the policy with the maps as the server holds them, and its
    ``__init__`` now raises. That failed restart must count (a crash fault) until the file is detached,
    not pass as "restarting" for ever while the built-in silently decides."""
    path = tmp_path / "fails_to_restart.py"
    path.write_text(FAILS_TO_RESTART)
    slot = PolicySlot("queue", QUEUE["priority-fair"], GuardConfig(budget_seconds=0.2), lambda _: None)
    slot.swap(load_file(path))
    job = [QueuedJob("j", JobSpec(command=("x",)), 0.0, 0)]
    try:
        deadline = time.monotonic() + 120
        while not slot.info()["detached"]:
            assert time.monotonic() < deadline, slot.info()["faults"]
            with slot.lock:
                order_pending(slot.current, QueueView(now=10.0), job)
            time.sleep(0.05)
        faults = slot.info()["faults"]
    finally:
        slot.close()
    assert faults.get("order_key:timeout") == 1, faults
    assert faults.get("order_key:crash", 0) >= 4, faults  # each try to build it again, until detached


HARMLESS_QUEUE = """\
from gpuslice.programs.api import QueueOps


class Harmless(QueueOps):
    name = "harmless"
"""
TIMED_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
# One of each way a queue file misbehaves, each quick to provoke: a C call holding the GIL (the worker is
# killed), memory, a garbage answer, two exceptions (q_deep_recursion_by_nesting builds for longer than
# the 0.3 s budget on a loaded machine: a timeout, not the exception it means; the slot and serve
# tests have it).
TIMED_FILES = ["q_sum_range", "q_numpy_ones", "q_garbage", "q_raises", "q_zero_division"]


@pytest.mark.parametrize("stem", TIMED_FILES)
def test_a_hostile_queue_file_in_a_timed_replay_leaves_the_order_to_the_builtin(
    stem: str, tmp_path: Path
) -> None:
    from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
    from gpuslice.sim.timed_trace import load_timed_trace
    from gpuslice.sim.trace import NODE_FILE

    (tmp_path / NODE_FILE).write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,2,V100M16\n")
    rows = [f"p{i},1000,1024,1,1000,,LS,Running,{i},{i + 50 + 10 * i},{i}" for i in range(12)]
    (tmp_path / "openb_pod_list_t.csv").write_text(TIMED_HEADER + "\n" + "\n".join(rows) + "\n")
    trace = load_timed_trace("t", tmp_path)
    config = GuardConfig(budget_seconds=0.3, max_faults=3)
    path = HOSTILE / f"{stem}.py"
    before = rss_bytes()
    with Ticker() as ticker:
        result = replay_timed(trace, ReplayConfig("bestfit", str(path), "none", 1.0), guard_config=config)
    harmless = tmp_path / "harmless.py"
    harmless.write_text(HARMLESS_QUEUE)
    baseline = replay_timed(trace, ReplayConfig("bestfit", str(harmless), "none", 1.0), guard_config=config)
    assert result.start.tolist() == baseline.start.tolist()  # the default ordered every queue
    kinds = fault_kinds({k: n for k, n in result.fallbacks.items() if k.startswith("guard.")})
    assert kinds & expected(path), result.fallbacks
    assert ticker.worst < 1.0, f"this process stalled {ticker.worst:.2f} s while the hook ran"
    assert rss_bytes() - before < SLACK_BYTES


EVICT_HOLDS_GIL = """\
from gpuslice.programs.api import DecisionContext, MemoryOps, MemoryView


class HoldsTheGil(MemoryOps):
    name = "holds-the-gil"
    summary = "every activation sums a huge range in one C call"
    kind = "evict"

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        sum(range(10**11))
"""


def test_a_memory_hook_that_holds_the_gil_leaves_memsim_to_the_driver(tmp_path: Path) -> None:
    """Memory hooks are called per page fault, in the run's worker process with ``memsim`` too: a hook
    stuck in one C call is killed there, the driver's policy decides, and the file is detached."""
    from gpuslice.cli.memsim import _simulate
    from gpuslice.memory import SimConfig, make_workload, simulate
    from gpuslice.programs.loader import memory_ops

    path = tmp_path / "holds_the_gil.py"
    path.write_text(EVICT_HOLDS_GIL)
    data = make_workload("llm-moe-decode", scale=0.25)
    with Ticker() as ticker:
        result = _simulate(data, str(path), "tree", SimConfig(oversub=1.5), lambda k: None)
    driver = simulate(data, memory_ops("default", "tree"), SimConfig(oversub=1.5))
    assert (result.faults, result.evictions) == (driver.faults, driver.evictions)
    assert fault_kinds(result.policy_faults) == {"timeout"}, result.policy_faults
    assert ticker.worst < 1.0, f"this process stalled {ticker.worst:.2f} s while the hook ran"
