"""A batch run with a policy file, whole, in a forked worker process (``programs/run_isolation.py``).

Each run below is a small loop of guarded hook calls, as a replay makes them; the hooks misbehave at
chosen calls. What is promised: a hook that holds the GIL past its budget costs that one call (the
child is killed and the run redone with that call falling back), memory a hook takes is bounded and the
run goes on, a child that dies in a hook is a crash fault, a file that stalls every call is detached
after ``max_faults`` restarts, errors come back as errors, and the parent loads only result classes.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuslice.errors import InternalError, UnknownPolicy
from gpuslice.programs.guard import GuardConfig, HookGuard
from gpuslice.programs.loader import PolicyRejected, load_file
from gpuslice.programs.run_isolation import _loads, isolated_run
from gpuslice.sim.openb import ReplayResult

CONFIG = GuardConfig(budget_seconds=0.2, max_faults=3, memory_limit_bytes=256 * 2**20)
HOARD: list[Any] = []


def calls_run(hook: Callable[[int], Any], calls: int = 8, log: Path | None = None) -> Callable[..., Any]:
    """A run that calls ``hook(i)`` for i in 0..calls-1 through a guard: each answer (None for a fault),
    the guard's faults and whether it detached."""

    def run(config: GuardConfig, relay: Callable[[int, int], None]) -> tuple[list[Any], dict[str, int], bool]:
        if log is not None:
            with log.open("a") as f:
                f.write("run\n")
        guard = HookGuard("placement", "test", config)
        answers = []
        for i in range(calls):
            answer, reason = (None, "detached") if guard.detached else guard.call("score", hook, (i,))
            if reason is not None and reason != "detached":
                guard.fault("score", reason)
            answers.append(None if reason else answer)
            relay(i + 1, calls)
        return answers, guard.fault_counts(), guard.detached

    return run


def gil_at_three(i: int) -> int:
    if i == 3:
        return sum(range(10**11))  # one C call that keeps the GIL for minutes
    return 2 * i


def test_a_hook_holding_the_gil_past_its_budget_costs_only_that_call() -> None:
    started = time.monotonic()
    answers, faults, detached = isolated_run(calls_run(gil_at_three), CONFIG)
    assert answers == [0, 2, 4, None, 8, 10, 12, 14]
    assert faults == {"score:timeout": 1} and not detached
    assert time.monotonic() - started < 60  # killed, not waited for


def _sum_size_for(cpu_seconds: float) -> int:
    """How long a ``sum(range(n))`` burns ``cpu_seconds`` of CPU on this machine (one C call, GIL held)."""
    n = 10**6
    while True:
        started = time.thread_time()
        sum(range(n))
        took = time.thread_time() - started
        if took > 0.05:
            return int(n * cpu_seconds / took)
        n *= 4


def test_a_call_that_keeps_the_gil_past_its_budget_and_returns_is_an_overrun_without_a_restart(
    tmp_path: Path,
) -> None:
    config = replace(CONFIG, budget_seconds=0.5)
    n = _sum_size_for(1.2 * config.budget_seconds)  # between CPU_SHARE (0.75) and the kill at 2 budgets

    def hook(i: int) -> int:
        return sum(range(n)) % 1 + i if i == 1 else i

    log = tmp_path / "runs"
    answers, faults, _ = isolated_run(calls_run(hook, calls=4, log=log), config)
    assert answers == [0, None, 2, 3]
    assert faults == {"score:overrun": 1}
    assert log.read_text().count("run") == 1  # judged when it returned, not killed


def always_stuck(i: int) -> int:
    return sum(range(10**11))


def test_a_file_stuck_in_every_call_is_detached_after_max_faults_restarts(tmp_path: Path) -> None:
    log = tmp_path / "runs"
    answers, faults, detached = isolated_run(calls_run(always_stuck, log=log), CONFIG)
    assert answers == [None] * 8 and detached
    assert faults == {"score:timeout": CONFIG.max_faults}
    assert log.read_text().count("run") == CONFIG.max_faults + 1  # each kill one run more, no more


def big_at_two(i: int) -> int:
    if i == 2:
        return int(np.ones(100_000_000).sum())  # 800 MB, above the 256 MiB limit
    return i


def test_a_hook_past_its_memory_limit_faults_as_memory_and_the_run_goes_on() -> None:
    answers, faults, _ = isolated_run(calls_run(big_at_two), CONFIG)
    assert answers == [0, 1, None, 3, 4, 5, 6, 7]
    assert faults == {"score:memory": 1}


def hoarding(i: int) -> int:
    HOARD.append(np.ones(10_000_000))  # 80 MB kept each call: the limit is for all calls together
    return i


def test_what_a_hook_keeps_counts_against_its_limit_across_calls() -> None:
    # a budget that writing 80 MB fits in on a busy machine: only the memory may fault here
    answers, faults, detached = isolated_run(calls_run(hoarding), replace(CONFIG, budget_seconds=5.0))
    assert answers[:2] == [0, 1]  # 160 MB kept: within 256 MiB
    assert faults == {"score:memory": CONFIG.max_faults} and detached
    assert not HOARD  # all of it happened in the child


def bigger_than_the_limit_outside_hooks(config: GuardConfig, relay: Any) -> int:
    guard = HookGuard("placement", "test", config)
    guard.call("score", lambda: 0, ())
    big = np.ones(100_000_000)  # the run's own memory is not the policy's: not limited
    return int(big.sum())


def test_the_runs_own_memory_is_not_limited_only_the_hooks() -> None:
    assert isolated_run(bigger_than_the_limit_outside_hooks, CONFIG) == 100_000_000


def dies_at_one(i: int) -> int:
    if i == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return i


def test_a_worker_that_dies_in_a_hook_is_a_crash_fault_of_that_call() -> None:
    answers, faults, _ = isolated_run(calls_run(dies_at_one), CONFIG)
    assert answers == [0, None, 2, 3, 4, 5, 6, 7]
    assert faults == {"score:crash": 1}


def test_memory_running_out_outside_any_hook_sets_the_file_aside_until_the_run_completes() -> None:
    def run(config: GuardConfig, relay: Any) -> tuple[dict[str, int], bool]:
        guard = HookGuard("placement", "test", config)
        for i in range(10):
            if not guard.detached:
                _, reason = guard.call("score", lambda x: x, (i,))
                if reason is not None:
                    guard.fault("score", reason)
        if not guard.detached:
            raise MemoryError  # as if the file's state had taken what the run needed
        return guard.fault_counts(), guard.detached

    faults, detached = isolated_run(run, CONFIG)
    assert detached and faults == {"score:memory": CONFIG.max_faults}


def test_progress_is_relayed_to_the_caller() -> None:
    seen: list[tuple[int, int]] = []
    isolated_run(calls_run(lambda i: i), CONFIG, lambda a, b: seen.append((a, b)))
    assert seen and seen[-1] == (8, 8)
    assert [a for a, _ in seen] == sorted(a for a, _ in seen)


def test_errors_come_back_as_errors() -> None:
    def unknown(config: GuardConfig, relay: Any) -> None:
        raise UnknownPolicy("no policy named x")

    def bug(config: GuardConfig, relay: Any) -> None:
        _ = 1 / 0

    def rejected(config: GuardConfig, relay: Any) -> None:
        load_file(Path(__file__).parent / "hostile" / "q_while_forever.py")

    with pytest.raises(UnknownPolicy, match="no policy named x"):
        isolated_run(unknown, CONFIG)
    with pytest.raises(PolicyRejected) as refused:  # an error whose __init__ takes other arguments
        isolated_run(rejected, CONFIG)
    assert refused.value.violations and "while" in str(refused.value)
    with pytest.raises(InternalError, match="ZeroDivisionError"):
        isolated_run(bug, CONFIG)


def test_the_parent_loads_results_but_nothing_that_names_a_function() -> None:
    result = ReplayResult("t", "p", 1, 1000, np.arange(3), np.arange(3), np.zeros(3), 0, 0.1, {"a:b": 1})
    loaded = _loads(pickle.dumps(("ok", result)))
    assert isinstance(loaded[1], ReplayResult) and loaded[1].arrived_gpu_milli.tolist() == [0, 1, 2]

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("true",))

    with pytest.raises(pickle.UnpicklingError, match=r"posix\.system"):
        _loads(pickle.dumps(Evil()))


def _children() -> set[int]:
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


def test_an_interrupted_caller_leaves_no_worker_behind() -> None:
    def slow(config: GuardConfig, relay: Any) -> None:
        time.sleep(60)

    before = _children()

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            isolated_run(slow, CONFIG)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert _children() - before == set()
