"""Where a guarded hook runs: the watchdog thread that interrupts a hook past its budget, and the worker
threads a hook call runs on so that its caller can abandon it (``programs/guard.py`` explains both)."""

from __future__ import annotations

import ctypes
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from itertools import count
from typing import TYPE_CHECKING, Any

from gpuslice.advice import Fallback

if TYPE_CHECKING:
    from gpuslice.programs.guard import HookGuard

__all__ = [
    "ABANDON_CPU_SHARE",
    "CPU_SHARE",
    "TOKENS",
    "WATCHDOG",
    "WATCHDOG_POLL_MAX_SECONDS",
    "WATCHDOG_POLL_MIN_SECONDS",
    "Armed",
    "HookTimeout",
    "Job",
    "Watchdog",
    "Worker",
    "process_cpu_seconds",
    "run_job",
]

# A hook is interrupted, or its late answer dropped, once it has burned this share of its budget in CPU
# after the watchdog first saw it (at most a quarter budget after its start): wall time alone would fault
# hooks that merely waited for a CPU on a busy machine.
CPU_SHARE = 0.75
# A call on a worker is abandoned by its caller once the worker burned this many budgets of CPU on it:
# by then the watchdog's interruption (at CPU_SHARE, polled every quarter budget) would have landed in
# Python code, so what is left is a call stuck in C. The caller waits at most this much hook CPU.
ABANDON_CPU_SHARE = 2.0
# The watchdog wakes every budget / 4 of the strictest live guard, within these bounds: an interruption
# lands at most a quarter budget late, and a placement-only process wakes 4 times a second, not 200
# (each wake-up takes the GIL from the deciding thread). Below 5 ms (the interpreter's switch interval)
# polling gains nothing.
WATCHDOG_POLL_MIN_SECONDS = 0.005
WATCHDOG_POLL_MAX_SECONDS = 0.25


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of process ``pid`` (Linux ``/proc/PID/stat``); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime: fields 14 and 15 of stat


class HookTimeout(BaseException):
    """Raised inside a hook that ran past its budget (by the watchdog thread)."""


class Armed:
    """One hook call the watchdog watches. ``cpu_seen`` is the thread's CPU clock when the watchdog first
    saw the call (None until then); the CPU a hook burned after that is what counts against it."""

    __slots__ = ("budget", "cpu_seen", "deadline", "thread_id")

    def __init__(self, thread_id: int, deadline: float, budget: float) -> None:
        self.thread_id, self.deadline, self.budget = thread_id, deadline, budget
        self.cpu_seen: float | None = None

    def burned(self, cpu_now: float) -> bool:
        """Whether the hook used ``CPU_SHARE`` of its budget since it was first seen (a lower bound of
        what it used: the first sighting comes within a quarter budget of its start)."""
        return self.cpu_seen is not None and cpu_now - self.cpu_seen >= CPU_SHARE * self.budget


class Watchdog:
    """One daemon thread for the process: interrupts armed hook calls past their budget."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.armed: dict[int, Armed] = {}  # token -> call
        self.injected: set[int] = set()
        self.guards: weakref.WeakSet[HookGuard] = weakref.WeakSet()
        self._clocks: dict[int, int] = {}  # thread id -> its CPU clock id
        self._thread: threading.Thread | None = None
        # Two prototypes of one C function: raise an exception class, or clear with NULL (a py_object
        # None would be Py_None, which the interpreter would then try to raise).
        api = ctypes.pythonapi
        self._raise = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
            ("PyThreadState_SetAsyncExc", api)
        )
        self._clear = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
            ("PyThreadState_SetAsyncExc", api)
        )
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        """In a forked child (``tune --jobs``, ``sim openb --jobs``) only the forking thread lives: a lock
        the parent's watchdog thread held at the fork would stay taken for ever (the child's first guard
        hung in ``watch``), and the calls armed and threads seen are the parent's. Start clean."""
        self.lock = threading.Lock()
        self.armed = {}
        self.injected = set()
        self._clocks = {}
        self._thread = None

    def watch(self, hook_guard: HookGuard) -> None:
        """Start polling (if not yet) at a pace that suits ``hook_guard``'s budget."""
        with self.lock:
            self.guards.add(hook_guard)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="gpuslice-policy-watchdog", daemon=True)
            self._thread.start()

    def _cpu(self, thread_id: int) -> float | None:
        """Another thread's CPU clock (seconds), None if the thread is gone."""
        try:
            clock = self._clocks.get(thread_id)
            if clock is None:
                clock = self._clocks[thread_id] = time.pthread_getcpuclockid(thread_id)
            return time.clock_gettime(clock)
        except OSError:
            self._clocks.pop(thread_id, None)
            return None

    def _run(self) -> None:
        while True:  # a daemon thread for the life of the process; idles while nothing is armed
            with self.lock:
                budgets = [g.budget for g in self.guards]
            poll = min(budgets, default=4 * WATCHDOG_POLL_MAX_SECONDS) / 4
            time.sleep(min(max(poll, WATCHDOG_POLL_MIN_SECONDS), WATCHDOG_POLL_MAX_SECONDS))
            if not self.armed:
                continue
            now = time.perf_counter()
            with self.lock:
                for token, call in list(self.armed.items()):
                    cpu = self._cpu(call.thread_id)
                    if cpu is None:
                        continue
                    if call.cpu_seen is None:
                        call.cpu_seen = cpu
                    # dict.pop is atomic: either this thread or the hook's own disarm takes the entry
                    elif now > call.deadline and call.burned(cpu) and self.armed.pop(token, None) is not None:
                        self.injected.add(token)
                        self._raise(call.thread_id, HookTimeout)

    def disarm(self, token: int, thread_id: int) -> None:
        """Stop watching ``token``. If the hook's thread takes the entry first (the common case, no lock),
        no interruption can follow; if the watchdog took it, wait for it to finish sending (its lock) and
        cancel the interruption if it has not been delivered yet."""
        if self.armed.pop(token, None) is not None:
            return
        with self.lock:
            if token in self.injected:
                self.injected.discard(token)
                self._clear(thread_id, None)  # NULL clears a pending async exception

    def forget(self, token: int) -> None:
        """After a delivered interruption: nothing is pending for ``token`` any more."""
        with self.lock:
            self.armed.pop(token, None)
            self.injected.discard(token)


WATCHDOG = Watchdog()
TOKENS = count()


_NO_EVENT = threading.Event()  # a placeholder, never waited on


class Job:
    """One hook call handed to a worker: its arguments, and what came back (or why nothing did)."""

    __slots__ = ("abandoned", "answer", "args", "armed", "cpu_finished", "cpu_started", "done", "fn",
                 "lock", "reason")  # fmt: skip

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], deadline: float, budget: float) -> None:
        self.fn, self.args = fn, args
        self.armed = Armed(0, deadline, budget)
        self.answer: Any = None
        self.reason: str | None = None
        self.cpu_started = -1.0  # the thread's CPU clock when it began the call; -1 until then
        self.cpu_finished = -1.0
        self.abandoned = False
        # Made by ``Worker.run`` only: a call in the caller's own thread needs neither (and each costs
        # microseconds, more than the rest of a guarded call).
        self.done: threading.Event = _NO_EVENT
        self.lock: threading.Lock | None = None  # orders "the caller gave up" against "the call ended"

    def abandon(self) -> bool:
        """The caller stops waiting: True if the call was still running (its worker goes idle when it
        ends), False if it ended just now (the caller uses its answer as usual)."""
        assert self.lock is not None, "only a call on a worker can be abandoned"
        with self.lock:
            self.abandoned = not self.done.is_set()
            return self.abandoned


class Worker:
    """A thread that runs one guard's hook calls, so that the caller can stop waiting for a slow one.

    A worker runs one call at a time; the guard keeps the idle ones. One whose call was abandoned puts
    itself back when that call ends; a policy that keeps overrunning is detached after ``max_faults``,
    so at most that many workers are ever busy with abandoned calls."""

    def __init__(self, idle: list[Worker]) -> None:
        self._idle = idle
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._clock: int | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._loop, name="gpuslice-policy-hook", daemon=True).start()
        self._ready.wait()

    def run(self, job: Job) -> None:
        job.done, job.lock = threading.Event(), threading.Lock()
        self._jobs.put(job)

    def release(self) -> None:
        self._idle.append(self)

    def cpu(self) -> float | None:
        """This worker's CPU clock, read from another thread."""
        try:
            return time.clock_gettime(self._clock) if self._clock is not None else None
        except OSError:
            return None

    def _loop(self) -> None:
        ident = threading.get_ident()
        self._clock = time.pthread_getcpuclockid(ident)
        self._ready.set()
        while True:  # a daemon thread; lives as long as the process, idle between calls
            job = self._jobs.get()
            run_job(job, ident)
            assert job.lock is not None
            with job.lock:
                job.done.set()
                abandoned = job.abandoned
            if abandoned:
                self.release()


def run_job(job: Job, ident: int, clocks: bool = True) -> None:
    """Run ``job`` in this thread (``ident``), watched by the watchdog; its answer or why none came.
    ``clocks``: read this thread's CPU clock around the call (a worker's caller needs it; the caller's
    own thread reads it afterwards, only on the rare path past the budget)."""
    job.armed.thread_id = ident
    if clocks:
        job.cpu_started = time.thread_time()
    token = next(TOKENS)
    try:
        WATCHDOG.armed[token] = job.armed
        try:
            job.answer = job.fn(*job.args)
        finally:
            WATCHDOG.disarm(token, ident)
    except HookTimeout:
        WATCHDOG.forget(token)
        job.reason = Fallback.TIMEOUT
    except MemoryError:  # in a worker process, its address-space limit (run_isolation.py)
        job.reason = Fallback.MEMORY
    except Exception as err:  # the policy's bug: counted, the default decides (STYLE.md habit 5)
        job.reason = f"{Fallback.EXCEPTION} {type(err).__name__}"
    if clocks:
        job.cpu_finished = time.thread_time()
    job.fn = job.args = None  # type: ignore[assignment]  # nothing of the policy's kept alive
