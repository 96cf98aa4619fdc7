"""A policy that raises, overruns, loops or answers garbage never stops placement: the default decides,
the fault is counted, and repeated faults detach it — in the openb replay, the memory simulator, and for
queue hooks."""

from __future__ import annotations

import textwrap
import threading
import time
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
from gpuslice.programs.guard import GuardConfig, HookGuard, HookTimeout, family_default, guard
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
