"""The runtime guard: every hook of a loaded policy runs timed, checked, and replaceable by the default.

```text
guarded.hook(args)                        # same signature as the ops family's hook (memory: guard_memory.py)
    detached?  -> default.hook(args)
    on a worker thread (placement, queue): arm watchdog (deadline = now + budget)
        -> answer = policy.hook(args) -> disarm;   the caller waits, and gives up once the worker has
        burned ABANDON_CPU_SHARE budgets (a call stuck in C, past the watchdog's reach): "timeout";
        the worker finishes on its own, and until it has every call gets the default at once ("busy")
    exception | interrupted (timeout) | returned after the budget (overrun) | wrong type or shape
        -> faults[(hook, reason)] += 1, on_event(...), answer = default.hook(args)
    max_faults within window_seconds -> detached: on_detach(), every later call goes to the default
```

Interrupting a hook that never returns (the choice, and its limits): the verifier already forbids
``while``, recursion and generators, so a verified hook ends — but ``for i in range(10**12)`` ends too
late. A single watchdog thread polls the armed calls (every quarter of the strictest budget) and, once
a call is past its deadline and has burned its CPU share, raises ``HookTimeout`` inside the hook's
thread with ``PyThreadState_SetAsyncExc``. It works in any thread (``signal.setitimer`` only in the
main one) and costs the hot path two clock reads and two dict operations (``sys.settrace`` would slow
every line); about 3 µs per guarded call in all. ``HookTimeout`` derives from ``BaseException`` and
the verifier forbids ``except BaseException`` and bare ``except``, so the policy cannot swallow it.
Limits: the exception lands at the next bytecode boundary, so a single long C call (a huge numpy
sort, ``10 ** 10 ** 8``) is not cut short. So that such a call cannot hold up a daemon (serve decides
under its lock), placement and queue hooks run on worker threads of the guard (``hook_runner.Worker``;
about 50 µs per call against a few µs in the caller's thread, on this project's loaded 2-core VM): the
caller stops waiting as above and the default decides; this works where the C code releases the GIL,
as numpy's array loops, sorts and linear algebra do (a C call that keeps the GIL blocks every thread,
which only a separate process could avoid). Memory hooks, called per page fault by the simulator, and
replays (``abandon=False``) run in the caller's thread. The interruption comes up to a quarter
budget (plus the interpreter's 5 ms switch interval) late; CPython only.

Budgets are seconds per call, per family (``DEFAULT_BUDGETS``, sized by ``benchmarks/policy_overhead.py``),
and what counts is the CPU a hook burns. A call is judged only once it is past its budget in wall time
(two cheap clock reads per call), and then only if its thread burned ``CPU_SHARE`` of the budget since
the watchdog first saw it (the thread's CPU clock, read on that rare path only). A hook that merely
waited for a CPU on a busy machine, or for the GIL, is not faulted. With ``interrupt=False`` there is
no watchdog, and the thread's CPU clock around every call decides (exact, but two syscalls per call).
The budgets are far above what the built-in policies need on the largest inputs, and small enough that
a runaway hook costs one decision, not the system.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from gpuslice.advice import Fallback
from gpuslice.errors import InternalError
from gpuslice.policies.base import PlacementOps
from gpuslice.policies.queue.base import QueueOps, QueueView
from gpuslice.programs.hook_runner import (
    ABANDON_CPU_SHARE,
    WATCHDOG,
    HookTimeout,
    Job,
    Worker,
    run_job,
)
from gpuslice.workload.job import Priority

__all__ = [
    "DEFAULT_BUDGETS",
    "FAMILY_GUARDS",
    "MIN_MEMORY_LIMIT_BYTES",
    "GuardConfig",
    "GuardedFactory",
    "GuardedPlacement",
    "GuardedQueue",
    "HookGuard",
    "HookTimeout",
    "family_default",
    "file_info",
    "guard",
    "guard_faults",
    "guarded_factory",
]

# Seconds of CPU per hook call, per family (benchmarks/policy_overhead.py, RESULTS.md, policy-file overhead).
# FGD's first score over a 6,000-node cluster (every node stale) is the largest call a built-in makes; queue
# and memory hooks take microseconds. The margins also cover a full garbage collection inside a hook.
DEFAULT_BUDGETS: dict[str, float] = {"placement": 2.0, "queue": 0.5, "eviction": 0.1, "prefetch": 0.1}


@dataclass
class GuardConfig:
    """How strict the guard is. ``budget_seconds`` None means the family's ``DEFAULT_BUDGETS`` entry."""

    budget_seconds: float | None = None
    max_faults: int = 5
    window_seconds: float = 60.0
    interrupt: bool = True  # False: overruns are only detected when the hook returns
    # With the watchdog: run each call on a worker thread the caller can abandon, so that a daemon keeps
    # deciding while a hook is stuck in one long C call. None: yes for placement and queue policies (serve
    # and the extender decide under a lock), no for memory policies (a simulator calls them per fault,
    # microseconds each, and nobody waits on them). A replay may say False (no daemon waits there).
    abandon: bool | None = None
    # A policy *file* of an isolated family (``guard_isolated.ISOLATED_FAMILIES``) runs in a worker process
    # with this address-space limit; False keeps it in the server's process (tests of the thread guard).
    isolate: bool = True
    memory_limit_bytes: int = 512 * 2**20

    def budget_for(self, family: str) -> float:
        return DEFAULT_BUDGETS[family] if self.budget_seconds is None else self.budget_seconds

    def abandon_for(self, family: str) -> bool:
        return self.interrupt and (family in ("placement", "queue") if self.abandon is None else self.abandon)

    def without_interrupt(self) -> GuardConfig:
        """The same limits for a guard whose calls are bounded elsewhere (a worker process is killed)."""
        return replace(self, interrupt=False)


# A worker's own address space (Python, numpy, the policy API; measured at about 115 MiB) and room for
# a policy's state: a smaller limit would make every call a memory fault.
MIN_MEMORY_LIMIT_BYTES = 256 * 2**20

_MISSING = object()

# Set only in a batch run's worker process (``run_isolation.CallMonitor``): numbers each guarded call.
CALL_MONITOR: Any = None


def fault_kind(reason: str) -> Fallback:
    """The code a fault is counted under: its reason's first word ("exception ValueError" is an
    ``EXCEPTION``, "crash (exit 9)" a ``CRASH``); a reason no producer should give counts as ``INVALID``
    (its words still reach the event)."""
    try:
        return Fallback(reason.split(" ", 1)[0])
    except ValueError:
        return Fallback.INVALID


class HookGuard:
    """Timing, fault counting and detaching for one loaded policy; the family wrappers call ``call``."""

    def __init__(
        self,
        family: str,
        name: str,
        config: GuardConfig | None = None,
        on_event: Callable[[str], None] | None = None,
        on_detach: Callable[[], None] | None = None,
    ) -> None:
        self.family = family
        self.name = name
        self.config = config or GuardConfig()
        self.budget = self.config.budget_for(family)
        self.on_event = on_event
        self.on_detach = on_detach
        self.faults: Counter[tuple[str, str]] = Counter()
        self.events: deque[str] = deque(maxlen=100)
        self.detached = False
        self.calls = 0
        self.slowest: dict[str, float] = {}  # hook -> longest call that returned, wall seconds
        self._recent: deque[float] = deque()
        self._recent_kinds: deque[str] = (
            deque()
        )  # the kind of each fault in ``_recent``, for the detach event
        self._idle: list[Worker] = []  # worker threads waiting for a call (abandon mode)
        self._abandon = self.config.abandon_for(family)
        self._stuck: list[Job] = []  # abandoned calls still running (at most one: see ``call``)
        if self.config.interrupt:
            WATCHDOG.watch(self)

    def call(self, hook: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, str | None]:
        """Run ``fn(*args)`` timed; (answer, None) or (_MISSING, fault reason). In a batch run's worker
        process (``CALL_MONITOR`` set) the call is numbered and shown to the parent, which kills the run
        if the call holds the GIL past its budget, and may have marked it as a fault that does not run."""
        monitor = CALL_MONITOR
        if monitor is None:
            return self._call(hook, fn, args)
        forced = monitor.begin(self.budget)
        if forced is not None:
            self.calls += 1
            return _MISSING, forced
        try:
            answer, reason = self._call(hook, fn, args)
        finally:
            overran = monitor.end()
        # a call that kept the GIL throughout is one the watchdog never saw: the monitor's clock judges it
        return (_MISSING, Fallback.OVERRUN) if reason is None and overran else (answer, reason)

    def _call(self, hook: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, str | None]:
        """``call`` in this process. With the watchdog, the call runs on one of this guard's worker
        threads and the caller waits for it: a hook stuck in one long C call (numpy releases the GIL
        there, so the caller can wake) is abandoned once it burned ``ABANDON_CPU_SHARE`` budgets of CPU,
        and the default decides at once; the worker finishes the call on its own and its answer is
        dropped."""
        self.calls += 1
        started = time.perf_counter()
        if not self.config.interrupt:
            return self._call_measured(hook, fn, args, started)
        if not self._abandon:
            return self._call_inline(hook, fn, args, started)
        if self._stuck:  # an abandoned call still runs: the default decides without starting another
            self._stuck = [j for j in self._stuck if not j.done.is_set()]
            if self._stuck:
                return _MISSING, Fallback.BUSY
        try:
            worker = self._idle.pop()
        except IndexError:
            worker = Worker(self._idle)
        job = Job(fn, args, started + self.budget, self.budget)
        worker.run(job)
        if not job.done.wait(self.budget):
            while not job.done.wait(self.budget / 4):
                cpu = worker.cpu()
                burned = cpu is not None and 0 <= job.cpu_started <= cpu - ABANDON_CPU_SHARE * self.budget
                if burned and job.abandon():
                    self._stuck.append(job)
                    return _MISSING, Fallback.TIMEOUT  # the worker drops the answer, goes idle at its end
                if job.done.is_set():
                    break
        worker.release()
        return self._judged(hook, job, started)

    def _call_inline(
        self, hook: str, fn: Callable[..., Any], args: tuple[Any, ...], started: float
    ) -> tuple[Any, str | None]:
        """With the watchdog, in the caller's own thread (``abandon`` off): interrupted, never abandoned."""
        job = Job(fn, args, started + self.budget, self.budget)
        run_job(job, threading.get_ident(), clocks=False)
        return self._judged(hook, job, started)

    def _judged(self, hook: str, job: Job, started: float) -> tuple[Any, str | None]:
        if job.reason is not None:
            return _MISSING, job.reason
        elapsed = time.perf_counter() - started
        if elapsed > self.slowest.get(hook, 0.0):
            self.slowest[hook] = elapsed
        # Past the wall budget, only CPU the hook burned makes it an overrun (not a busy machine's wait).
        cpu = job.cpu_finished if job.cpu_finished >= 0 else None  # None: this thread ran it, read now
        if elapsed > self.budget and job.armed.burned(time.thread_time() if cpu is None else cpu):
            return _MISSING, Fallback.OVERRUN
        return job.answer, None

    def _call_measured(
        self, hook: str, fn: Callable[..., Any], args: tuple[Any, ...], started: float
    ) -> tuple[Any, str | None]:
        """Without the watchdog: the thread's CPU clock around the call decides an overrun."""
        cpu = time.thread_time()
        try:
            answer = fn(*args)
        except MemoryError:
            return _MISSING, Fallback.MEMORY
        except Exception as err:
            return _MISSING, f"{Fallback.EXCEPTION} {type(err).__name__}"
        elapsed = time.perf_counter() - started
        if elapsed > self.slowest.get(hook, 0.0):
            self.slowest[hook] = elapsed
        if time.thread_time() - cpu > self.budget:
            return _MISSING, Fallback.OVERRUN
        return answer, None

    def continue_from(self, previous: HookGuard) -> None:
        """Carry on ``previous``'s record: a factory built a new instance of the same file (another
        ledger, another target workload), and the file's faults, not the instance's, lead to its detach."""
        self.faults, self.events = previous.faults, previous.events
        self._recent, self._recent_kinds = previous._recent, previous._recent_kinds
        self.detached, self.calls = previous.detached, previous.calls

    def fault(self, hook: str, reason: str) -> None:
        """Count one fault, record the event, and detach after ``max_faults`` within the window."""
        kind = fault_kind(reason)
        self.faults[(hook, kind)] += 1
        self._emit(f"policy {self.name} ({self.family}): {hook} {reason}; the default decided")
        now = time.monotonic()
        self._recent.append(now)
        self._recent_kinds.append(kind)
        while self._recent and now - self._recent[0] > self.config.window_seconds:
            self._recent.popleft()
            self._recent_kinds.popleft()
        if not self.detached and len(self._recent) >= self.config.max_faults:
            self.detached = True
            why = ", ".join(f"{kind} x{n}" for kind, n in Counter(self._recent_kinds).most_common())
            self._emit(
                f"policy {self.name} ({self.family}) detached after {len(self._recent)} faults within "
                f"{self.config.window_seconds:g} s ({why}); the default is restored"
            )
            if self.on_detach is not None:
                self.on_detach()

    def _emit(self, text: str) -> None:
        self.events.append(text)
        if self.on_event is not None:
            self.on_event(text)

    def fault_counts(self) -> dict[str, int]:
        """Faults as ``{"hook:reason": n}`` (JSON-friendly)."""
        return {f"{hook}:{reason}": n for (hook, reason), n in sorted(self.faults.items())}


def _guarded(
    wrapper: Any,
    hook: str,
    args: tuple[Any, ...],
    check: Callable[[Any], Any] | None,
    reset: Callable[[tuple[Any, ...]], None] | None = None,
) -> Any:
    """One guarded hook call: the policy's checked answer, or the default's on any fault. A hook the policy
    inherits from its base is the base's own code: it runs unguarded (and free of the guard's cost)."""
    g: HookGuard = wrapper.guard
    if hook in wrapper.inherited and not g.detached:
        return getattr(wrapper.policy, hook)(*args)
    if not g.detached:
        answer, reason = g.call(hook, getattr(wrapper.policy, hook), args)
        if reason is None:
            if check is None:
                return answer
            checked = check(answer)
            if checked is not _MISSING:
                return checked
            reason = Fallback.INVALID
        if reset is not None:
            reset(args)  # a request the faulty hook made before failing must not be applied
        g.fault(hook, reason)
    return getattr(wrapper.default, hook)(*args)


def _inherited(policy: Any, base: type, hooks: tuple[str, ...]) -> set[str]:
    """The hooks ``policy`` does not override."""
    return {h for h in hooks if getattr(type(policy), h) is getattr(base, h)}


_PLACEMENT_HOOKS = ("filter", "score", "normalize", "pick_gpus", "on_placed", "on_released")
_QUEUE_HOOKS = ("priority", "order_key", "may_preempt", "on_started", "on_finished")


# -- placement --------------------------------------------------------------------------------------
def _float_vector(answer: Any, length: int) -> Any:
    try:
        scores = np.asarray(answer, dtype=np.float64)
    except (TypeError, ValueError):
        return _MISSING
    if scores.shape != (length,) or np.isnan(scores).any():
        return _MISSING
    return scores


class GuardedPlacement(PlacementOps):
    """A loaded placement policy behind the guard; the placer uses it like any ``PlacementOps``."""

    def __init__(self, policy: PlacementOps, default: PlacementOps, guard: HookGuard) -> None:
        self.policy, self.default, self.guard = policy, default, guard
        self.inherited = _inherited(policy, PlacementOps, _PLACEMENT_HOOKS)  # base hooks call no others
        self.view, self.context = policy.view, policy.context
        self.name = policy.name  # type: ignore[misc]
        self.summary = policy.summary  # type: ignore[misc]

    @property  # type: ignore[override]
    def tie_break(self) -> Any:
        return (self.default if self.guard.detached else self.policy).tie_break

    @property  # type: ignore[override]
    def memory_in_score(self) -> bool:
        # once detached, memory may matter to the default; cached scores of the policy stay valid advice
        return (self.default if self.guard.detached else self.policy).memory_in_score

    def filter(self, view: Any, req: Any) -> np.ndarray | None:
        def check(answer: Any) -> Any:
            if answer is None:
                return None
            ok = isinstance(answer, np.ndarray) and answer.shape == (view.node_count,)
            return answer.astype(bool) if ok else _MISSING

        return _guarded(self, "filter", (view, req), check)

    def score(self, view: Any, req: Any, nodes: np.ndarray) -> np.ndarray:
        return _guarded(self, "score", (view, req, nodes), lambda a: _float_vector(a, len(nodes)))

    def normalize(self, view: Any, req: Any, scores: np.ndarray) -> np.ndarray:
        return _guarded(self, "normalize", (view, req, scores), lambda a: _float_vector(a, len(scores)))

    def pick_gpus(self, view: Any, req: Any, node: int) -> tuple[int, ...] | None:
        def check(answer: Any) -> Any:
            if answer is None:  # no advice: the mechanism's default GPUs
                return None
            if not isinstance(answer, tuple | list) or not all(
                isinstance(g, int | np.integer) and not isinstance(g, bool) for g in answer
            ):
                return _MISSING
            return tuple(int(g) for g in answer)

        return _guarded(self, "pick_gpus", (view, req, node), check)

    def on_placed(self, view: Any, placement: Any) -> None:
        _guarded(self, "on_placed", (view, placement), None)

    def on_released(self, view: Any, placement: Any) -> None:
        _guarded(self, "on_released", (view, placement), None)


# -- queue ------------------------------------------------------------------------------------------
def _read_only_view(view: QueueView) -> QueueView:
    """The same view with its tenant maps behind read-only proxies (a policy cannot change them)."""
    return QueueView(
        now=view.now,
        aging_seconds=view.aging_seconds,
        tenant_weight=MappingProxyType(view.tenant_weight),  # type: ignore[arg-type]
        tenant_gpus=MappingProxyType(view.tenant_gpus),  # type: ignore[arg-type]
    )


def _plain_key(key: Any) -> bool:
    """A sort key the mechanism can compare without running policy code: numbers, strings, tuples."""
    if isinstance(key, tuple):
        return all(_plain_key(k) for k in key)
    if isinstance(key, float):
        return key == key  # NaN breaks sorting
    return isinstance(key, int | str | bool)


def _checked_key(key: Any) -> Any:
    return key if isinstance(key, tuple) and _plain_key(key) else _MISSING


class GuardedQueue(QueueOps):
    """A loaded queue policy behind the guard; ``order_pending``/``effective_priority`` use it as usual."""

    def __init__(self, policy: QueueOps, default: QueueOps, guard: HookGuard) -> None:
        self.policy, self.default, self.guard = policy, default, guard
        self.inherited = _inherited(policy, QueueOps, _QUEUE_HOOKS)
        if "priority" not in self.inherited:
            self.inherited.discard("order_key")  # the base order_key calls the policy's own priority
        self._views: tuple[QueueView | None, Any] = (None, None)  # a step's view and its read-only copy
        self.name = policy.name  # type: ignore[misc]
        self.summary = policy.summary  # type: ignore[misc]

    def _read_only(self, view: QueueView) -> QueueView:
        """The read-only copy of ``view``, made once for all the jobs of one step."""
        views = self._views  # one attribute, replaced whole: safe if two threads decide at once
        if views[0] is not view:
            views = self._views = (view, _read_only_view(view))
        return views[1]

    def priority(self, view: QueueView, job: Any) -> int:
        own = int(job.spec.priority)

        def check(level: Any) -> Any:
            ok = type(level) is int or isinstance(level, Priority)
            return int(level) if ok and own <= level <= max(own, int(Priority.HIGH)) else _MISSING

        return _guarded(self, "priority", (self._read_only(view), job), check)

    def order_key(self, view: QueueView, job: Any) -> tuple[Any, ...]:
        return _guarded(self, "order_key", (self._read_only(view), job), _checked_key)

    def may_preempt(self, view: QueueView, preemptor: Any, victim: Any) -> bool:
        check = lambda answer: answer if type(answer) is bool else _MISSING  # noqa: E731
        return _guarded(self, "may_preempt", (self._read_only(view), preemptor, victim), check)

    def on_started(self, view: QueueView, job: Any) -> None:
        _guarded(self, "on_started", (self._read_only(view), job), None)

    def on_finished(self, view: QueueView, job: Any) -> None:
        _guarded(self, "on_finished", (self._read_only(view), job), None)


# -- building -----------------------------------------------------------------------------------------
def _memory_base() -> type:
    from gpuslice.memory.hooks import MemoryOps  # loads the memory engine: only for memory policies

    return MemoryOps


def _memory_wrapper(policy: Any, default: Any, hook_guard: HookGuard) -> Any:
    from gpuslice.programs.guard_memory import guarded_memory  # loads the memory engine

    return guarded_memory(policy, default, hook_guard)


@dataclass(frozen=True, slots=True)
class _Family:
    """How one family is guarded: its base ops class (the default that decides on faults or after a
    detach) and the wrapper that guards each of its hooks."""

    base: Callable[[], type]
    wrap: Callable[[Any, Any, HookGuard], Any]


# The one dispatch table of the guard: family name -> how it is guarded. The memory entries import the
# memory engine only when a memory policy is guarded.
FAMILY_GUARDS: dict[str, _Family] = {
    "placement": _Family(lambda: PlacementOps, GuardedPlacement),
    "queue": _Family(lambda: QueueOps, GuardedQueue),
    "eviction": _Family(_memory_base, _memory_wrapper),
    "prefetch": _Family(_memory_base, _memory_wrapper),
}


def _family(family: str) -> _Family:
    try:
        return FAMILY_GUARDS[family]
    except KeyError:  # callers pass a family the verifier or the loader named: a bug, not user input
        known = ", ".join(FAMILY_GUARDS)
        raise InternalError(f"bug: no guard for policy family {family!r}; known: {known}") from None


def family_default(family: str) -> Callable[..., Any]:
    """The base ops class of ``family`` (its defaults decide when a policy faults or is detached)."""
    return _family(family).base()


def guard(
    family: str,
    policy: Any,
    default: Any,
    config: GuardConfig | None = None,
    on_event: Callable[[str], None] | None = None,
    on_detach: Callable[[], None] | None = None,
) -> Any:
    """Wrap an ops instance of ``family``: every hook call guarded, ``default`` deciding on faults."""
    entry = _family(family)
    return entry.wrap(policy, default, HookGuard(family, policy.name, config, on_event, on_detach))


def guarded_factory(
    loaded: Any, config: GuardConfig | None = None, on_event: Callable[[str], None] | None = None
) -> Callable[..., Any]:
    """A factory with the family's constructor arguments that builds ``loaded`` guarded, with the
    family's base ops as the default (``resolve`` uses it for ``--policy FILE``)."""
    config = config or GuardConfig()
    if config.isolate:
        from gpuslice.programs.guard_isolated import (  # imports this module
            ISOLATED_FAMILIES,
            isolated_factory,
        )

        if loaded.family in ISOLATED_FAMILIES:
            return isolated_factory(loaded, config, on_event)
    default_factory = family_default(loaded.family)

    def build(*args: Any) -> Any:
        policy = loaded.instantiate(*args)
        return guard(loaded.family, policy, default_factory(*args), config, on_event)

    return GuardedFactory(loaded, build)


def guard_faults(*ops: Any) -> dict[str, int]:
    """The faults of those of ``ops`` that are guarded policy files, as ``guard.<hook>:<reason>``: how a
    replay's results list them beside the placer's own fallbacks."""
    return {
        f"guard.{key}": n
        for one in ops
        if (hook_guard := getattr(one, "guard", None)) is not None
        for key, n in hook_guard.fault_counts().items()
    }


def file_info(loaded: Any, loaded_at: float, guard: HookGuard | None) -> dict[str, Any]:
    """A loaded policy file as ``policy list`` shows it: its family, name, hash, path, when it was loaded,
    its guard's faults and whether it is detached (none and no while nothing has built it)."""
    return {
        "family": loaded.family,
        "name": loaded.name,
        "builtin": False,
        "sha256": loaded.sha256,
        "path": loaded.path,
        "loaded_at": loaded_at,
        "faults": guard.fault_counts() if guard is not None else {},
        "detached": guard is not None and guard.detached,
    }


class GuardedFactory:
    """Builds guarded instances of one loaded file with the family's constructor arguments. Its
    instances share one fault record (each new one carries on the last one's), so that the file is
    detached after its faults however often a caller builds it anew (serve's placer is rebuilt when the
    shapes it knows change; the extender builds one per ledger). ``guard``: the newest instance's."""

    def __init__(self, loaded: Any, make: Callable[..., Any], process: Any = None) -> None:
        self.loaded, self.name, self.process = loaded, loaded.name, process
        self.loaded_at = time.time()
        self._make = make
        self.guard: HookGuard | None = None

    def close(self) -> None:
        """Stop the file's worker process, if it has one (a server's shutdown)."""
        if self.process is not None:
            self.process.close()

    def info(self) -> dict[str, Any]:
        """The file as ``policy list`` shows it (``file_info``); no faults until the first instance."""
        return file_info(self.loaded, self.loaded_at, self.guard)

    def __call__(self, *args: Any) -> Any:
        wrapper = self._make(*args)
        if self.guard is not None:
            wrapper.guard.continue_from(self.guard)
        self.guard = wrapper.guard
        return wrapper
