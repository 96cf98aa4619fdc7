"""A policy that raises, overruns, loops or answers garbage never stops placement: the default decides,
the fault is counted, and repeated faults detach it — in the openb replay, the memory simulator, and for
queue hooks."""

from __future__ import annotations

import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuslice.errors import InternalError
from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger.ledger import Ledger
from gpuslice.memory import SimConfig, make_workload, simulate
from gpuslice.memory.hooks import DEFAULT, HEAD, USED, Composed, DecisionContext, MemoryOps
from gpuslice.memory.policies import PREFETCH
from gpuslice.policies import PlacementOps, PolicyContext, placement_policy
from gpuslice.policies.queue import Fifo, PriorityFair
from gpuslice.policies.queue.base import JobRef, QueuedJob, QueueOps, QueueView, order_pending
from gpuslice.programs.guard import (
    GuardConfig,
    GuardedFactory,
    HookGuard,
    HookTimeout,
    family_default,
    guard,
    guard_faults,
)
from gpuslice.programs.loader import load_source, resolve
from gpuslice.scheduler.placer import Placer, Unplaced
from gpuslice.sim.openb import replay
from gpuslice.sim.trace import OpenbTrace
from gpuslice.workload.job import JobSpec, Priority
from gpuslice.workload.request import Request


def placement_file(tmp_path: Path, score_body: str, name: str = "bad") -> str:
    source = textwrap.dedent(
        """\
        import numpy as np

        from gpuslice.programs.api import PlacementOps


        class Bad(PlacementOps):
            name = "NAME"

            def score(self, view, req, nodes):
        """
    ).replace("NAME", name) + textwrap.indent(textwrap.dedent(score_body), "        ")
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return str(path)


@pytest.mark.parametrize(
    ("trick", "body", "reason"),
    [
        ("raises", "raise ValueError('policy bug')", "exception"),
        ("returns_garbage", "return 'garbage'", "invalid"),
        ("returns_wrong_shape", "return np.zeros(len(nodes) + 1)", "invalid"),
        ("returns_nan", "return np.full(len(nodes), np.nan)", "invalid"),
        (
            "loops_past_its_budget",
            "total = 0\nfor i in range(10 ** 12):\n    total += i\nreturn np.zeros(len(nodes))",
            "timeout",
        ),
    ],
)
@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "worker-process"])
def test_a_faulty_placement_file_never_stops_the_replay_and_is_detached(
    small: OpenbTrace, tmp_path: Path, trick: str, body: str, reason: str, same_replay: Any, isolate: bool
) -> None:
    config = GuardConfig(budget_seconds=0.05, max_faults=3, isolate=isolate)
    empty = placement_file(tmp_path, "return np.zeros(len(nodes))", name="empty")
    bad = placement_file(tmp_path, body)
    baseline = replay(small, empty, 42, guard_config=config)
    result = replay(small, bad, 42, guard_config=config)
    # every pod was tried; the default (equal scores) decided every score, so the run is the baseline's
    assert len(result.allocated_gpu_milli) == len(baseline.allocated_gpu_milli) > 100
    assert same_replay(result, baseline)
    # three faults, then detached: the policy's score was never called again. A loop past its budget is
    # abandoned on its worker; until the interrupt lands there (later on a loaded machine) the next calls
    # get the default at once ("busy"), which counts as a fault too.
    assert baseline.fallbacks == {}
    assert result.fallbacks[f"guard.score:{reason}"] >= 1
    if isolate and reason == "timeout":
        # the worker is killed at its first timeout; the default decides while a fresh one starts
        # ("restarting", not a fault), and this short replay may end before it is up
        assert set(result.fallbacks) <= {"guard.score:timeout", "guard.score:restarting"}
        assert 1 <= result.fallbacks["guard.score:timeout"] <= 3
        return
    assert sum(result.fallbacks.values()) == 3
    allowed = {f"guard.score:{reason}"} | ({"guard.score:busy"} if reason == "timeout" else set())
    assert set(result.fallbacks) <= allowed


def test_detached_policy_is_not_called_again_and_events_say_why() -> None:
    events: list[str] = []
    loaded = load_source(
        "import numpy as np\nfrom gpuslice.programs.api import PlacementOps\n\n\nclass Bad(PlacementOps):\n"
        "    name = 'bad'\n\n    def score(self, view, req, nodes):\n        raise ValueError('no')\n",
        "bad.py",
    )
    ledger = Ledger([NodeSpec(f"n{i}", 16000, 65536 * 2**20, 2, "V100M16") for i in range(4)])
    context = PolicyContext(rng=np.random.default_rng(0))
    ops = guard(
        "placement",
        loaded.instantiate(ledger.view, context),
        PlacementOps(ledger.view, context),
        GuardConfig(max_faults=2),
        events.append,
    )
    placer = Placer(ledger, ops)
    for cpu in (1000, 1100):  # distinct shapes: each one scores afresh
        assert not isinstance(placer.place(Request(cpu_milli=cpu, num_gpu=1, gpu_milli=100)), Unplaced)
    assert ops.guard.detached
    calls = ops.guard.calls  # score twice: the hooks it inherits are the base's code, not guarded
    for cpu in (1200, 1300, 1400):
        assert not isinstance(placer.place(Request(cpu_milli=cpu, num_gpu=1, gpu_milli=100)), Unplaced)
    assert ops.guard.calls == calls == 2
    assert ops.guard.faults == {("score", "exception"): 2}
    assert events[0] == "policy bad (placement): score exception ValueError; the default decided"
    assert events[-1].startswith("policy bad (placement) detached after 2 faults within 60 s")


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "worker"])
def test_a_file_rebuilt_for_a_new_ledger_keeps_its_faults_and_stays_detached(tmp_path, isolate) -> None:
    """serve rebuilds its placer when the shapes it knows change, the extender once per ledger: a file
    that faults once per instance must still be detached after its faults, not start afresh each time."""
    factory = resolve(
        placement_file(tmp_path, "raise ValueError('policy bug')"),
        "placement",
        placement_policy,
        GuardConfig(max_faults=2, isolate=isolate),
    )
    built = []
    for cpu in (1000, 1100, 1200):  # one placement per instance, as after each rebuild
        ledger = Ledger([NodeSpec(f"n{i}", 16000, 65536 * 2**20, 2, "V100M16") for i in range(4)])
        built.append(factory(ledger.view, PolicyContext(rng=np.random.default_rng(0))))
        placed = Placer(ledger, built[-1]).place(Request(cpu_milli=cpu, num_gpu=1, gpu_milli=100))
        assert not isinstance(placed, Unplaced)
    if factory.process is not None:
        factory.process.close()
    assert built[1].guard.detached and built[2].guard.detached
    assert built[2].guard.faults == {("score", "exception"): 2}  # the third never called the file
    assert factory.guard is built[2].guard


def burn(seconds: float) -> int:
    """Busy until this thread has used ``seconds`` of CPU (however long a busy machine makes that)."""
    end = time.thread_time() + seconds
    for n in range(10**9):
        if time.thread_time() > end:
            return n
    return -1


def test_a_slow_hook_that_returns_is_an_overrun_and_its_answer_is_dropped() -> None:
    g = HookGuard("queue", "slow", GuardConfig(budget_seconds=0.01, interrupt=False))
    answer, reason = g.call("order_key", lambda: burn(0.05) and (1,), ())
    assert reason == "overrun" and answer != (1,)


def test_a_hook_that_only_waited_past_its_wall_budget_is_not_faulted() -> None:
    # a busy machine: the thread waits (here: sleeps) without burning CPU; that is not the policy's cost
    for interrupt in (True, False):
        g = HookGuard("queue", "waits", GuardConfig(budget_seconds=0.02, interrupt=interrupt))
        assert g.call("order_key", lambda: time.sleep(0.08) or (1,), ()) == ((1,), None)


def test_the_interruption_never_escapes_into_the_caller() -> None:
    # hooks that end around their deadline: a late interruption must be cancelled or caught, never
    # delivered into the caller's code
    g = HookGuard("queue", "edge", GuardConfig(budget_seconds=0.02))
    reasons = []
    for i in range(120):
        try:
            _, reason = g.call("order_key", burn, (0.005 * (1 + i % 8),))
            reasons.append(reason)
            burn(0.002)  # the caller's code: an undelivered interruption would land here
        except HookTimeout:  # pragma: no cover - the failure this test exists to catch
            pytest.fail("HookTimeout escaped the guard")
    assert set(reasons) <= {None, "timeout", "overrun"}
    assert None in reasons and {"timeout", "overrun"} & set(reasons)


def test_a_hook_running_in_another_thread_is_interrupted_too() -> None:
    g = HookGuard("queue", "loop", GuardConfig(budget_seconds=0.02))
    out: list[Any] = []

    def spin() -> None:
        total = 0
        for i in range(10**12):
            total += i

    thread = threading.Thread(target=lambda: out.append(g.call("priority", spin, ())))
    started = time.perf_counter()
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and out[0][1] == "timeout"
    assert time.perf_counter() - started < 5


# -- queue ------------------------------------------------------------------------------------------
class _Meddler(QueueOps):
    """Unverified Python (as a bug in a verified file could behave at run time)."""

    name = "meddler"

    def priority(self, view: QueueView, job: QueuedJob) -> int:
        return 99  # above HIGH: out of range

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        if job.seq == 0:
            view.tenant_weight["alice"] = 1000.0  # type: ignore[index]  # the view is read-only
        return (object(),)  # not a plain key: comparing it would run policy code in the sort


def _job(seq: int, priority: Priority = Priority.NORMAL) -> QueuedJob:
    return QueuedJob(f"j{seq}", JobSpec(command=("true",), priority=priority, tenant="alice"), 0.0, seq)


def test_queue_hooks_out_of_range_or_meddling_fall_back_to_the_default_order() -> None:
    weights = {"alice": 1.0}
    view = QueueView(now=10.0, tenant_weight=weights)
    ops = guard("queue", _Meddler(), PriorityFair(), GuardConfig(max_faults=100))
    jobs = [_job(0), _job(1, Priority.HIGH), _job(2)]
    assert ops.priority(view, jobs[0]) == int(Priority.NORMAL)
    assert [j.seq for j in order_pending(ops, view, jobs)] == [1, 0, 2]  # priority-fair's order
    assert weights == {"alice": 1.0}
    assert ops.guard.faults == {
        ("priority", "invalid"): 1,
        ("order_key", "exception"): 1,
        ("order_key", "invalid"): 2,
    }


class _Protector(QueueOps):
    name = "protector"

    def may_preempt(self, view: QueueView, preemptor: Any, victim: Any) -> Any:
        return {"a": False, "b": "no"}.get(victim.job_id) if victim.job_id != "c" else 1 / 0


def test_a_guarded_may_preempt_answer_is_used_and_a_wrong_one_falls_back_to_the_default() -> None:
    ops = guard("queue", _Protector(), QueueOps(), GuardConfig(max_faults=100))
    view, head = QueueView(now=0.0), JobRef("head", 300)
    answers = [ops.may_preempt(view, head, JobRef(victim, 100)) for victim in "abc"]
    assert answers == [False, True, True]
    assert ops.guard.faults == {("may_preempt", "invalid"): 1, ("may_preempt", "exception"): 1}


def test_a_guarded_builtin_queue_policy_orders_as_the_bare_one() -> None:
    view = QueueView(now=5000.0, tenant_gpus={"a": 2.0})
    jobs = [_job(i, Priority.LOW if i % 2 else Priority.NORMAL) for i in range(6)]
    bare = order_pending(PriorityFair(), view, jobs)
    guarded = order_pending(guard("queue", PriorityFair(), Fifo()), view, jobs)
    assert guarded == bare


# -- memory -----------------------------------------------------------------------------------------
class _RaisingEvict(MemoryOps):
    name = "raising"
    kind = "evict"

    def block_activate(self, view: Any, block: int, ctx: DecisionContext) -> None:
        ctx.request_reorder(USED, HEAD)  # made before the failure: must not be applied
        raise RuntimeError("bug")


def test_a_raising_eviction_hook_leaves_the_driver_in_charge_and_its_request_unapplied(
    memsim_outcome: Any,
) -> None:
    trace = make_workload("gemm", scale=0.02, seed=1)
    cfg = SimConfig(oversub=1.5)
    driver = simulate(trace, Composed(MemoryOps(), PREFETCH["tree"]()), cfg)
    ops = guard("eviction", _RaisingEvict(), MemoryOps(), GuardConfig(max_faults=10**9))
    faulty = simulate(trace, Composed(ops, PREFETCH["tree"]()), cfg)
    assert memsim_outcome(faulty) == memsim_outcome(driver)
    assert faulty.requests.get("APPLY", 0) == 0
    assert ops.guard.faults[("block_activate", "exception")] > 0


def test_guarded_memory_defines_only_the_hooks_its_policy_overrides() -> None:
    ops = guard("eviction", _RaisingEvict(), MemoryOps())
    assert type(ops).block_activate is not MemoryOps.block_activate
    assert (
        type(ops).page_prefetch is MemoryOps.page_prefetch
        and type(ops).block_access is MemoryOps.block_access
    )
    assert ops.block_access(None, 0, 1, DecisionContext("reorder")) == DEFAULT


def test_registry_name_gives_the_bare_builtin() -> None:
    assert resolve("fgd", "placement", placement_policy) is placement_policy("fgd")


# -- dispatch ---------------------------------------------------------------------------------------
def test_the_guard_table_covers_exactly_the_families_the_verifier_knows() -> None:
    from gpuslice.programs.guard import FAMILY_GUARDS
    from gpuslice.programs.verify import FAMILIES

    assert tuple(FAMILY_GUARDS) == FAMILIES
    assert family_default("placement") is PlacementOps and family_default("queue") is QueueOps
    assert family_default("eviction") is MemoryOps and family_default("prefetch") is MemoryOps


def test_guarding_a_family_without_an_entry_is_an_internal_error_not_a_user_error() -> None:
    with pytest.raises(InternalError, match="no guard for policy family 'lottery'; known: placement"):
        guard("lottery", Fifo(), Fifo())
    with pytest.raises(InternalError):
        family_default("lottery")


# -- abandoning a call stuck in C -------------------------------------------------------------------
def test_a_hook_stuck_in_one_long_numpy_call_is_abandoned_and_the_default_decides_meanwhile() -> None:
    """numpy releases the GIL in its sort; the watchdog cannot interrupt C code, but the caller stops
    waiting once the hook has burned two budgets of CPU (40 ms of a sort that needs hundreds), so the
    hook is certainly still sorting when the caller goes on, however busy the machine; the next call
    runs on another worker, and the abandoned one goes idle once its call ends."""
    big = np.random.default_rng(0).random(10_000_000)
    ended = threading.Event()

    def stuck() -> tuple[int]:
        try:
            np.sort(big)
        finally:  # runs even when the watchdog's interruption lands right after the C call
            ended.set()
        return (1,)

    g = HookGuard("queue", "stuck", GuardConfig(budget_seconds=0.02))
    assert g.call("order_key", stuck, ()) == (_missing(), "timeout")
    assert not ended.is_set()  # the caller went on while the hook was still inside np.sort
    assert g.call("order_key", lambda: (2,), ()) == (_missing(), "busy")  # no second call piles up
    assert ended.wait(120)
    deadline = time.monotonic() + 60
    while not g._idle and time.monotonic() < deadline:  # the abandoned worker goes idle on its own
        time.sleep(0.01)
    assert g.call("order_key", lambda: (2,), ()) == ((2,), None)


def _missing() -> Any:
    from gpuslice.programs.guard import _MISSING

    return _MISSING


# -- the guard's own bookkeeping: deterministic (a fake clock where time matters) ---------------------
class _Clock:
    """Stands in for the ``time`` module inside guard.py: every clock reads one number that the test
    moves (``advance``), so budgets, the slowest call and the fault window are judged exactly."""

    def __init__(self) -> None:
        self.now = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def perf_counter(self) -> float:
        return self.now

    def thread_time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    import gpuslice.programs.guard as guard_module

    fake = _Clock()
    monkeypatch.setattr(guard_module, "time", fake)
    return fake


def test_which_guards_abandon_a_stuck_call_and_which_run_it_in_the_callers_thread() -> None:
    default = GuardConfig()
    assert [default.abandon_for(f) for f in ("placement", "queue", "eviction", "prefetch")] == [
        True, True, False, False,
    ]  # fmt: skip
    assert not GuardConfig(abandon=False).abandon_for("placement")
    assert GuardConfig(abandon=True).abandon_for("eviction")
    assert not GuardConfig(interrupt=False, abandon=True).abandon_for("placement")  # no watchdog: inline
    assert (default.budget_for("queue"), GuardConfig(budget_seconds=3.0).budget_for("queue")) == (0.5, 3.0)
    strict = GuardConfig(max_faults=2, window_seconds=5.0, budget_seconds=0.1)
    relaxed = strict.without_interrupt()
    assert relaxed == GuardConfig(max_faults=2, window_seconds=5.0, budget_seconds=0.1, interrupt=False)
    assert strict.interrupt and relaxed.interrupt is False


def test_a_call_within_its_budget_answers_and_the_slowest_call_per_hook_is_kept(clock: _Clock) -> None:
    g = HookGuard("queue", "q", GuardConfig(budget_seconds=1.0, interrupt=False))
    took = lambda seconds: (clock.advance(seconds), seconds)[1]  # noqa: E731
    assert g.call("priority", took, (0.25,)) == (0.25, None)
    assert g.call("priority", took, (0.5,)) == (0.5, None)
    assert g.call("priority", took, (0.125,)) == (0.125, None)
    assert g.call("order_key", took, (1.0,)) == (1.0, None)  # exactly the budget: not an overrun
    assert g.slowest == {"priority": 0.5, "order_key": 1.0} and g.calls == 4
    answer, reason = g.call("order_key", took, (1.5,))
    assert reason == "overrun" and answer != 1.5
    assert g.call("priority", lambda: 1 / 0, ()) == (guard_module_missing(), "exception ZeroDivisionError")


def guard_module_missing() -> Any:
    from gpuslice.programs.guard import _MISSING

    return _MISSING


@pytest.mark.parametrize(
    "config",
    [GuardConfig(interrupt=False), GuardConfig(abandon=False), GuardConfig(abandon=True)],
    ids=["measured", "inline", "worker-thread"],
)
def test_every_way_of_calling_answers_with_the_hooks_result_and_records_its_time(config) -> None:
    g = HookGuard("eviction", "e", config)
    before = time.perf_counter()
    assert g.call("block_activate", lambda a, b: a + b, (2, 3)) == (5, None)
    took = time.perf_counter() - before
    assert list(g.slowest) == ["block_activate"] and 0 <= g.slowest["block_activate"] <= took
    answer, reason = g.call("block_activate", lambda: [].pop(), ())
    assert answer is guard_module_missing() and reason == "exception IndexError"


def test_a_hook_looping_in_the_callers_thread_is_interrupted() -> None:
    g = HookGuard("eviction", "e", GuardConfig(budget_seconds=0.05, abandon=False))
    answer, reason = g.call("block_activate", burn, (5.0,))  # uninterrupted, it would end as an overrun
    assert reason == "timeout" and answer is guard_module_missing()


def test_faults_within_the_window_detach_with_their_kinds_counted(clock: _Clock) -> None:
    events: list[str] = []
    detached: list[bool] = []
    g = HookGuard(
        "placement",
        "p",
        GuardConfig(max_faults=3, window_seconds=60.0),
        events.append,
        lambda: detached.append(True),
    )
    assert g.detached is False
    g.fault("score", "exception ValueError")
    clock.advance(61)  # the first fault leaves the window
    g.fault("score", "invalid")
    g.fault("filter", "exception KeyError")
    assert not g.detached and detached == []
    clock.advance(60)  # exactly the window after the second: still inside it
    g.fault("score", "exception TypeError")
    assert g.detached and detached == [True]
    assert g.faults == {("score", "exception"): 2, ("score", "invalid"): 1, ("filter", "exception"): 1}
    assert g.fault_counts() == {"filter:exception": 1, "score:exception": 2, "score:invalid": 1}
    assert events[0] == "policy p (placement): score exception ValueError; the default decided"
    assert events[-1] == (
        "policy p (placement) detached after 3 faults within 60 s (exception x2, invalid x1); "
        "the default is restored"
    )
    assert list(g.events) == events
    g.fault("score", "invalid")  # detached once only
    assert detached == [True]


def test_a_guard_keeps_its_last_100_events() -> None:
    g = HookGuard("queue", "q", GuardConfig(max_faults=10**6, interrupt=False))
    for k in range(150):
        g.fault("priority", f"exception E{k}")
    assert len(g.events) == 100 and g.events[0].endswith("priority exception E50; the default decided")


class _Monitor:
    """A batch run's call monitor (``run_isolation.CallMonitor``) as the guard sees it."""

    def __init__(self, forced: str | None = None, overran: bool = False) -> None:
        self.forced, self.overran = forced, overran
        self.budgets: list[float] = []
        self.ended = 0

    def begin(self, budget: float) -> str | None:
        self.budgets.append(budget)
        return self.forced

    def end(self) -> bool:
        self.ended += 1
        return self.overran


def test_under_a_batch_runs_monitor_each_call_is_shown_to_it_and_its_verdict_is_taken(monkeypatch) -> None:
    import gpuslice.programs.guard as guard_module

    g = HookGuard("queue", "q", GuardConfig(budget_seconds=0.5, interrupt=False))
    ran: list[int] = []
    monitor = _Monitor()
    monkeypatch.setattr(guard_module, "CALL_MONITOR", monitor)
    assert g.call("priority", lambda: ran.append(1) or 7, ()) == (7, None)
    assert monitor.budgets == [0.5] and monitor.ended == 1 and ran == [1] and g.calls == 1
    assert list(g.slowest) == ["priority"]
    monitor.overran = True  # kept the GIL past its budget: the monitor's clock judged it
    assert g.call("priority", lambda: 7, ()) == (guard_module_missing(), "overrun")
    assert g.call("priority", lambda: 1 / 0, ()) == (guard_module_missing(), "exception ZeroDivisionError")
    monitor.forced = "memory"  # the parent marked this call a fault: it does not run
    assert g.call("priority", lambda: ran.append(2), ()) == (guard_module_missing(), "memory")
    assert ran == [1] and g.calls == 4 and monitor.ended == 3


# -- placement hooks: the answers the guard lets through ------------------------------------------------
class _Answers(PlacementOps):
    name = "answers"
    summary = "answers what the test says"

    def __init__(self, view: Any, context: Any) -> None:
        super().__init__(view, context)
        self.answer: dict[str, Any] = {}
        self.released: list[Any] = []

    def filter(self, view: Any, req: Any) -> Any:
        return self.answer["filter"]

    def score(self, view: Any, req: Any, nodes: np.ndarray) -> Any:
        return self.answer["score"]

    def normalize(self, view: Any, req: Any, scores: np.ndarray) -> Any:
        return self.answer["normalize"]

    def pick_gpus(self, view: Any, req: Any, node: int) -> Any:
        return self.answer["pick_gpus"]

    def on_released(self, view: Any, placement: Any) -> None:
        self.released.append(placement)
        if placement == "bad":
            raise RuntimeError("bug")


class _Default(PlacementOps):
    def pick_gpus(self, view: Any, req: Any, node: int) -> Any:
        return "the default's"

    def filter(self, view: Any, req: Any) -> Any:
        return "the default's"

    def normalize(self, view: Any, req: Any, scores: np.ndarray) -> Any:
        return "the default's"

    def on_released(self, view: Any, placement: Any) -> None:
        self.released = placement


def _guarded_answers() -> Any:
    ledger = Ledger([NodeSpec(f"n{i}", 16000, 65536 * 2**20, 2, "V100M16") for i in range(3)])
    context = PolicyContext(rng=np.random.default_rng(0))
    policy = _Answers(ledger.view, context)
    return guard(
        "placement", policy, _Default(ledger.view, context), GuardConfig(max_faults=10**6)
    ), ledger.view


def test_a_guarded_placement_policy_keeps_its_name_and_summary() -> None:
    ops, _ = _guarded_answers()
    assert (ops.name, ops.summary) == ("answers", "answers what the test says")


def test_filter_answers_none_or_a_mask_of_every_node_and_anything_else_is_invalid() -> None:
    ops, view = _guarded_answers()
    req = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000)
    ops.policy.answer["filter"] = None  # no filter
    assert ops.filter(view, req) is None
    ops.policy.answer["filter"] = np.array([1, 0, 2])
    mask = ops.filter(view, req)
    assert mask.dtype == bool and mask.tolist() == [True, False, True]
    for wrong in (np.array([True, False]), [True, False, True], "all"):
        ops.policy.answer["filter"] = wrong
        assert ops.filter(view, req) == "the default's"
    assert ops.guard.faults == {("filter", "invalid"): 3}


def test_scores_are_floats_of_every_node_and_normalized_scores_too() -> None:
    ops, view = _guarded_answers()
    req, nodes = Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000), np.array([0, 2])
    ops.policy.answer["score"] = [3, 1]
    scores = ops.score(view, req, nodes)
    assert scores.dtype == np.float64 and scores.tolist() == [3.0, 1.0]
    ops.policy.answer["normalize"] = [1, 0]
    normalized = ops.normalize(view, req, np.array([3.0, 1.0]))
    assert normalized.dtype == np.float64 and normalized.tolist() == [1.0, 0.0]
    for wrong in ([1.0], [1.0, float("nan")], "high"):
        ops.policy.answer["normalize"] = wrong
        assert ops.normalize(view, req, np.array([3.0, 1.0])) == "the default's"
    assert ops.guard.faults == {("normalize", "invalid"): 3}


def test_pick_gpus_answers_none_or_whole_gpu_indices() -> None:
    ops, view = _guarded_answers()
    req = Request(cpu_milli=1000, num_gpu=2, gpu_milli=1000)
    ops.policy.answer["pick_gpus"] = None  # no advice: the mechanism's default GPUs
    assert ops.pick_gpus(view, req, 0) is None
    ops.policy.answer["pick_gpus"] = [np.int64(1), 0]
    picked = ops.pick_gpus(view, req, 0)
    assert picked == (1, 0) and all(type(g) is int for g in picked)
    for wrong in ((True, 0), (1.0, 0), "01", 1):
        ops.policy.answer["pick_gpus"] = wrong
        assert ops.pick_gpus(view, req, 0) == "the default's"
    assert ops.guard.faults == {("pick_gpus", "invalid"): 4}


def test_on_released_is_guarded_and_the_default_runs_when_it_fails() -> None:
    ops, view = _guarded_answers()
    ops.on_released(view, "fine")
    ops.on_released(view, "bad")
    assert ops.policy.released == ["fine", "bad"] and ops.default.released == "bad"
    assert ops.guard.faults == {("on_released", "exception"): 1}
    assert list(ops.guard.slowest) == ["on_released"]


# -- queue hooks ----------------------------------------------------------------------------------------
class _Levels(QueueOps):
    """Answers the level the test sets; records the views it was shown."""

    name = "levels"
    summary = "levels the test sets"

    def __init__(self) -> None:
        self.level: Any = None
        self.seen: list[QueueView] = []

    def priority(self, view: QueueView, job: Any) -> Any:
        self.seen.append(view)
        if self.level == "raise":
            raise RuntimeError("bug")
        return self.level

    def may_preempt(self, view: QueueView, preemptor: Any, victim: Any) -> bool:
        self.seen.append(view)
        return False

    def on_started(self, view: QueueView, job: Any) -> None:
        self.seen.append(view)
        raise RuntimeError("bug")

    def on_finished(self, view: QueueView, job: Any) -> None:
        self.seen.append(view)


def test_a_priority_is_a_level_between_the_jobs_own_and_high() -> None:
    ops = guard("queue", _Levels(), QueueOps(), GuardConfig(max_faults=10**6))
    assert (ops.name, ops.summary) == ("levels", "levels the test sets")
    view, job = QueueView(now=0.0), _job(0, Priority.NORMAL)
    fallback = int(Priority.NORMAL)
    for level, expected in [
        (int(Priority.NORMAL), int(Priority.NORMAL)),  # its own level
        (Priority.HIGH, int(Priority.HIGH)),  # the highest a policy may give
        (int(Priority.HIGH) + 1, fallback),
        (int(Priority.NORMAL) - 1, fallback),
        (True, fallback),  # a bool is no level
        (float(Priority.HIGH), fallback),
        ("high", fallback),
    ]:
        ops.policy.level = level
        answer = ops.priority(view, job)
        assert answer == expected and type(answer) is int, level
    assert ops.guard.faults == {("priority", "invalid"): 5}


def test_a_policy_that_overrides_only_priority_has_its_order_key_guarded_too() -> None:
    ops = guard("queue", _Levels(), QueueOps(), GuardConfig(max_faults=10**6))
    ops.policy.level = "raise"
    view = QueueView(now=0.0)
    assert ops.order_key(view, _job(0, Priority.HIGH)) == (-int(Priority.HIGH),)  # the default's key
    assert ops.guard.faults == {("order_key", "exception"): 1}


@pytest.mark.parametrize(
    ("key", "valid"),
    [((1.5, "a", True), True), ((1, (2, "b")), True), ((), True), ((float("nan"),), False),
     ((1, (2, None)), False), ((1, [2]), False), ([1], False), (1, False)],
)  # fmt: skip
def test_an_order_key_is_a_tuple_of_plain_comparable_values(key: Any, valid: bool) -> None:
    class Keyed(QueueOps):
        name = "keyed"

        def order_key(self, view: QueueView, job: Any) -> Any:
            return key

    ops = guard("queue", Keyed(), QueueOps(), GuardConfig(max_faults=10**6))
    answer = ops.order_key(QueueView(now=0.0), _job(0, Priority.HIGH))
    assert answer == (key if valid else (-int(Priority.HIGH),))
    assert ops.guard.faults == ({} if valid else {("order_key", "invalid"): 1})


def test_queue_hooks_see_one_read_only_copy_of_the_steps_view() -> None:
    ops = guard("queue", _Levels(), QueueOps(), GuardConfig(max_faults=10**6))
    ops.policy.level = int(Priority.NORMAL)
    view = QueueView(now=42.0, aging_seconds=7.0, tenant_weight={"a": 2.0}, tenant_gpus={"a": 1.5})
    job = _job(0)
    ops.priority(view, job)
    ops.may_preempt(view, JobRef("head", 300), JobRef("victim", 100))
    ops.on_started(view, job)  # raises: a fault, the default does nothing
    ops.on_finished(view, job)
    seen = ops.policy.seen
    assert len(seen) == 4 and all(s is seen[0] for s in seen)  # made once for the step
    copy = seen[0]
    assert (copy.now, copy.aging_seconds, dict(copy.tenant_weight), dict(copy.tenant_gpus)) == (
        42.0, 7.0, {"a": 2.0}, {"a": 1.5},
    )  # fmt: skip
    with pytest.raises(TypeError):
        copy.tenant_weight["a"] = 100.0  # type: ignore[index]
    with pytest.raises(TypeError):
        copy.tenant_gpus["b"] = 0.0  # type: ignore[index]
    assert ops.guard.faults == {("on_started", "exception"): 1}
    assert set(ops.guard.slowest) == {"priority", "may_preempt", "on_finished"}  # calls that returned
    ops.priority(QueueView(now=43.0), job)  # the next step: a new copy
    assert ops.policy.seen[-1] is not copy and ops.policy.seen[-1].now == 43.0


# -- building and listing ---------------------------------------------------------------------------
def test_guard_calls_on_detach_when_it_detaches() -> None:
    detached: list[bool] = []
    ops = guard(
        "queue", _Levels(), QueueOps(), GuardConfig(max_faults=1), on_detach=lambda: detached.append(True)
    )
    ops.policy.level = "raise"
    ops.priority(QueueView(now=0.0), _job(0))
    assert ops.guard.detached and detached == [True]


def test_guard_faults_lists_the_faults_of_guarded_ops_only() -> None:
    ops = guard("queue", _Levels(), QueueOps(), GuardConfig(max_faults=10**6))
    ops.policy.level = "raise"
    ops.priority(QueueView(now=0.0), _job(0))
    assert guard_faults(QueueOps(), ops, Fifo()) == {"guard.priority:exception": 1}


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "worker"])
def test_a_policy_file_is_listed_with_its_faults_and_events_reach_the_caller(tmp_path, isolate) -> None:
    events: list[str] = []
    before = time.time()
    factory = resolve(
        placement_file(tmp_path, "raise ValueError('policy bug')", name="listed"),
        "placement",
        placement_policy,
        GuardConfig(max_faults=1, isolate=isolate),
        events.append,
    )
    try:
        assert (factory.process is not None) == isolate  # a placement file runs in a worker process
        info = factory.info()
        assert before <= info["loaded_at"] <= time.time()
        assert {k: v for k, v in info.items() if k not in ("loaded_at", "sha256", "path")} == {
            "family": "placement", "name": "listed", "builtin": False, "faults": {}, "detached": False,
        }  # fmt: skip
        assert info["path"].endswith("listed.py") and len(info["sha256"]) == 64
        ledger = Ledger([NodeSpec(f"n{i}", 16000, 65536 * 2**20, 2, "V100M16") for i in range(2)])
        ops = factory(ledger.view, PolicyContext(rng=np.random.default_rng(0)))
        Placer(ledger, ops).place(Request(cpu_milli=1000, num_gpu=1, gpu_milli=100))
        info = factory.info()
        assert info["faults"] == {"score:exception": 1} and info["detached"] is True
        assert events and events[-1].startswith("policy listed (placement) detached after 1 faults")
    finally:
        factory.close()


def test_closing_a_factory_stops_its_process_if_it_has_one() -> None:
    class Process:
        closed = 0

        def close(self) -> None:
            self.closed += 1

    loaded = load_source(
        "from gpuslice.programs.api import QueueOps\n\n\nclass Q(QueueOps):\n    name = 'q'\n", "q.py"
    )
    GuardedFactory(loaded, lambda: None).close()  # none: nothing to stop
    process = Process()
    GuardedFactory(loaded, lambda: None, process).close()
    assert process.closed == 1


def test_a_hook_out_of_memory_is_a_memory_fault_not_an_exception() -> None:
    def hungry() -> None:
        raise MemoryError

    g = HookGuard("queue", "q", GuardConfig(interrupt=False))
    assert g.call("priority", hungry, ()) == (guard_module_missing(), "memory")


@pytest.mark.parametrize(
    "config", [GuardConfig(abandon=False), GuardConfig(abandon=True)], ids=["inline", "worker"]
)
def test_with_the_watchdog_the_slowest_call_is_kept_not_the_last(config) -> None:
    g = HookGuard("eviction", "e", replace(config, budget_seconds=60.0))
    assert g.call("block_activate", burn, (0.2,))[1] is None  # at least 0.2 s of CPU, so as long at least
    assert g.call("block_activate", lambda: 1, ()) == (1, None)
    assert g.slowest["block_activate"] >= 0.2


def test_a_fault_is_counted_under_its_reasons_first_word_however_many_follow() -> None:
    g = HookGuard("placement", "p", GuardConfig(max_faults=10**6, interrupt=False))
    g.fault("score", "crash (exit 9)")  # a worker process's death, as guard_isolated words it
    g.fault("score", "exception ValueError")
    g.fault("score", "nonsense from nowhere")  # no producer says this: invalid, its words still told
    assert g.fault_counts() == {"score:crash": 1, "score:exception": 1, "score:invalid": 1}
    assert g.events[-1] == "policy p (placement): score nonsense from nowhere; the default decided"
