"""A batch run with a policy file, whole, in a forked worker process (``sim openb``, ``sim replay``,
``tune``'s trials and ``memsim`` given a file).

Why the whole run rather than each call, as a server does (``policy_process.py``): a replay asks its
placement file once per pod and waits for each answer, so a round trip per call costs two process
wake-ups each time (120 µs p50 for a bare pipe ping-pong on this project's 2-core VM, 500 µs per call
in a replay once the answer and the ledger's changes go over): ``sim openb`` on the default trace took
3.1× as long with its file in a worker as in process. Nobody but the run waits on a batch run, so the
run itself moves: the child runs it with the thread guard in process (``guard.py``: it interrupts a hook
looping in Python, counts faults, detaches), and this process watches what that guard cannot stop.

```text
isolated_run(run, config)        run(child_config, relay) -> result, called in the child
  fork ─► child: SIGINT ignored (the parent stops it); dies with the parent; guard.CALL_MONITOR set:
  │       each guarded call's ordinal and budget are written to a page shared with the parent, and
  │       cleared when the call returns; while a hook runs, RLIMIT_AS bounds what it may allocate
  │       (``CallMonitor``: the policy's memory_limit_bytes, for all its calls together)
  └─► parent: waits for the answer (pickled by the child; loaded here with only result classes allowed),
      relays progress, and reads the page: a call that returns having burned CPU_SHARE of its budget is an
      "overrun" (judged by the child's monitor: a call that kept the GIL is one the thread guard's
      watchdog never saw); a call in flight past its budget that burned
      ABANDON_CPU_SHARE budgets of CPU (or WALL_CAP budgets of wall time) is one the thread guard could
      not interrupt (one C call holding the GIL): the child is killed and the run starts again from its
      beginning with that call marked as a fault ("timeout"; "crash ..." for a child that died in a hook)
```

A run is deterministic given its seed and the policy's answers, so the new run reaches the same call;
there the guard counts the fault and the default decides, as in process, and the file is detached after
its faults as usual. A file that forces ``max_faults`` restarts is detached from its last one on,
whatever the guard's window, so a run restarts at most ``max_faults + 1`` times. A ``MemoryError``
outside any hook (the machine's memory ran out) is answered the same way: from the last call on, the
file's calls fault as "memory" until it is detached.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import io
import mmap
import os
import pickle
import resource
import signal
import struct
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, is_dataclass, replace
from enum import Enum
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from gpuslice.errors import GpusliceError, InternalError
from gpuslice.programs import guard as guard_module
from gpuslice.programs.guard import GuardConfig
from gpuslice.programs.hook_runner import ABANDON_CPU_SHARE, CPU_SHARE, process_cpu_seconds
from gpuslice.programs.policy_process import WALL_CAP

__all__ = ["CallMonitor", "isolated_run"]

R = TypeVar("R")
Relay = Callable[[int, int], None]

# The shared page: the call in flight (0: none), the last call started, progress (two numbers and a
# sequence number bumped after they are written), and the budget of the call in flight.
_PAGE = struct.Struct("=qqqqqd")
_IN_FLIGHT, _LAST, _A, _B, _SEQ, _BUDGET = range(6)
_POLL_SECONDS = 0.1  # progress is relayed this often at least
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class CallMonitor:
    """The child's side: set as ``guard.CALL_MONITOR`` so that every guarded call is numbered and shown
    to the parent; ``forced`` calls fault at once with the reason given (what killed the last run).

    Memory: the run's own code is not limited (as in process), but a hook is. While a hook runs, the
    child's soft ``RLIMIT_AS`` is its size at the call's start plus what is left of the policy's
    ``memory_limit``; what the address space grew by during the call counts against it (a policy that
    keeps what it allocates uses its limit up), what it shrank by is given back."""

    def __init__(
        self, page: mmap.mmap, forced: dict[int, str], fault_from: tuple[int, str] | None, memory_limit: int
    ) -> None:
        self.page, self.forced, self.fault_from = page, forced, fault_from
        self.ordinal = 0
        self.memory_limit, self.retained = memory_limit, 0
        self._statm = -1
        self._size_at_begin = 0
        self._budget, self._cpu_at_begin = 0.0, 0.0
        self._soft, self._hard = resource.getrlimit(resource.RLIMIT_AS)

    def _put(self, field: int, value: float) -> None:
        fmt = "d" if field == _BUDGET else "q"
        struct.pack_into("=" + fmt, self.page, 8 * field, value)

    def _size(self) -> int:
        if self._statm < 0:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        return int(os.pread(self._statm, 64, 0).split()[0]) * _PAGE_BYTES

    def begin(self, budget: float) -> str | None:
        """Number the next call; the reason it must fault without running, or None (then ``end`` after)."""
        self.ordinal += 1
        forced = self.forced.get(self.ordinal)
        if forced is None and self.fault_from is not None and self.ordinal >= self.fault_from[0]:
            forced = self.fault_from[1]
        if forced is not None:
            return forced
        if self.memory_limit > 0:
            self._size_at_begin = self._size()
            room = max(self.memory_limit - self.retained, 0)
            soft = self._size_at_begin + room
            if self._hard != resource.RLIM_INFINITY:
                soft = min(soft, self._hard)
            resource.setrlimit(resource.RLIMIT_AS, (soft, self._hard))
        self._budget, self._cpu_at_begin = budget, time.thread_time()
        self._put(_LAST, self.ordinal)
        self._put(_BUDGET, budget)
        self._put(_IN_FLIGHT, self.ordinal)  # last: the parent reads the budget of the call it sees
        return None

    def end(self) -> bool:
        """The call returned: whether it burned ``CPU_SHARE`` of its budget (an overrun, as in process;
        this thread ran it, and a call that kept the GIL throughout is one the watchdog never saw)."""
        self._put(_IN_FLIGHT, 0)
        if self.memory_limit > 0:
            resource.setrlimit(resource.RLIMIT_AS, (self._soft, self._hard))
            self.retained = max(self.retained + self._size() - self._size_at_begin, 0)
        return time.thread_time() - self._cpu_at_begin >= CPU_SHARE * self._budget

    def relay(self, a: int, b: int) -> None:
        self._put(_A, a)
        self._put(_B, b)
        self._put(_SEQ, struct.unpack_from("=q", self.page, 8 * _SEQ)[0] + 1)


# -- what the child sends back ---------------------------------------------------------------------------
_BUILTINS = frozenset({"dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str",
                       "bytes", "bytearray", "bool", "object", "slice", "range"})  # fmt: skip
_ALLOWED = {
    "copyreg": frozenset({"__newobj__", "_reconstructor"}),
    "collections": frozenset({"Counter", "OrderedDict"}),
    "numpy": frozenset({"ndarray", "dtype"}),
    "numpy.core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy.core.numeric": frozenset({"_frombuffer"}),
    "numpy._core.numeric": frozenset({"_frombuffer"}),
    "numpy._core.multiarray": frozenset({"_reconstruct", "scalar"}),
}


class _ResultUnpickler(pickle.Unpickler):
    """Loads what the child sends without letting it name any function to call: plain containers,
    numpy arrays, and gpuslice's own dataclasses, enums and errors (the child ran a policy file)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module == "builtins" and name in _BUILTINS) or name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "numpy.dtypes" or module.startswith("gpuslice."):
            found = super().find_class(module, name)
            if isinstance(found, type) and (
                (module == "numpy.dtypes") or is_dataclass(found) or issubclass(found, Enum | GpusliceError)
            ):
                return found
        raise pickle.UnpicklingError(f"the run's worker sent {module}.{name}, which no result holds")


def _rebuilt_error(module: str, name: str, args: tuple[Any, ...], attributes: dict[str, Any]) -> Exception:
    """The child's gpuslice error, made again here without its ``__init__``."""
    cls = _ResultUnpickler(io.BytesIO(b"")).find_class(module, name)
    if not (isinstance(cls, type) and issubclass(cls, GpusliceError)):
        raise pickle.UnpicklingError(f"the run's worker raised {module}.{name}, which is not an error")
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(attributes)
    return err


def _loads(data: bytes) -> Any:
    return _ResultUnpickler(io.BytesIO(data)).load()


@dataclass(frozen=True)
class _Outcome:
    kind: str  # "ok", "fault" (a call to force), "fault_from" (every call from one on), "error"
    value: Any = None
    ordinal: int = 0
    reason: str = ""


def _child(
    run: Callable[[GuardConfig, Relay], Any],
    config: GuardConfig,
    monitor: CallMonitor,
    write_fd: int,
) -> None:
    """The forked child's whole life; it never returns into the caller's code."""
    status = 0
    try:
        faulthandler.disable()  # a crash is reported by the parent, as the fault of the call in flight
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        guard_module.CALL_MONITOR = monitor
        try:
            # the hooks in this process, each in the caller's thread: a call stuck in C is the parent's
            message: tuple[Any, ...] = (
                "ok",
                run(replace(config, isolate=False, abandon=False), monitor.relay),
            )
        except MemoryError:
            message = ("memory", monitor.ordinal)
        except GpusliceError as err:
            # an error's own class, message and attributes: its __init__ may take other arguments
            message = ("raise", type(err).__module__, type(err).__qualname__, err.args, vars(err))
        except Exception:  # the run's own bug: shown in full by the parent
            message = ("error", traceback.format_exc())
        try:
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except MemoryError:
            data = pickle.dumps(("memory", monitor.ordinal))
        except Exception:
            data = pickle.dumps(("error", traceback.format_exc()))
        Connection(write_fd, readable=False).send_bytes(data)
    except BaseException:  # nothing may unwind into the parent's copy of the stack
        status = 70
    finally:
        os._exit(status)


def _exit_reason(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"crash (killed by {signal.Signals(os.WTERMSIG(status)).name})"
    return f"crash (exit {os.waitstatus_to_exitcode(status)})"


def _died(page: mmap.mmap, status: int) -> _Outcome:
    """A child that ended without an answer: a crash fault of the call it was in, else an error (the run's
    own code died: nothing of the policy's to blame)."""
    in_flight = _PAGE.unpack_from(page)[_IN_FLIGHT]
    if in_flight:
        return _Outcome("fault", ordinal=in_flight, reason=_exit_reason(status))
    raise InternalError(f"a policy run's worker process ended without an answer: {_exit_reason(status)}")


def _one_run(
    run: Callable[[GuardConfig, Relay], Any],
    config: GuardConfig,
    forced: dict[int, str],
    fault_from: tuple[int, str] | None,
    progress: Relay | None,
) -> _Outcome:
    page = mmap.mmap(-1, _PAGE.size)
    monitor = CallMonitor(page, forced, fault_from, config.memory_limit_bytes)
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():  # Python 3.12+ warns of forking a threaded process; see _child
        warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child: coverage does not follow a fork)
        os.close(read_fd)
        _child(run, config, monitor, write_fd)
    os.close(write_fd)
    answer = Connection(read_fd, writable=False)
    reaped = False
    try:
        seen_seq, watched = 0, (0, 0.0, 0.0)  # (ordinal, wall when first seen, child CPU then)
        while not answer.poll(_POLL_SECONDS):
            in_flight, _, a, b, seq, budget = _PAGE.unpack_from(page)
            if progress is not None and seq != seen_seq:
                seen_seq = seq
                progress(a, b)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reaped = True
                return _died(page, status)
            if not in_flight:
                watched = (0, 0.0, 0.0)
                continue
            now, cpu = time.monotonic(), process_cpu_seconds(pid) or 0.0
            if watched[0] != in_flight:
                watched = (in_flight, now, cpu)
                continue
            burned, waited = cpu - watched[2], now - watched[1]
            if (waited >= budget and burned >= ABANDON_CPU_SHARE * budget) or waited >= WALL_CAP * budget:
                return _Outcome("fault", ordinal=in_flight, reason="timeout")
        try:
            data: bytes | None = answer.recv_bytes()
        except (EOFError, OSError):
            data = None  # it died as it answered
        if data is None:
            _, status = os.waitpid(pid, 0)
            reaped = True
            return _died(page, status)
        if progress is not None:
            _, _, a, b, seq, _ = _PAGE.unpack_from(page)
            if seq != seen_seq:
                progress(a, b)
        message = _loads(data)
        kind = message[0]
        if kind == "ok":
            return _Outcome("ok", value=message[1])
        if kind == "memory":
            return _Outcome("fault_from", ordinal=max(message[1], 1), reason="memory")
        if kind == "raise":
            raise _rebuilt_error(*message[1:])
        raise InternalError(f"a policy run failed in its worker process:\n{message[1]}")
    finally:
        answer.close()
        if not reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        page.close()


def isolated_run(
    run: Callable[[GuardConfig, Relay], R], config: GuardConfig, progress: Relay | None = None
) -> R:
    """``run(child_config, relay)`` in a forked worker process (see the module docstring): its result,
    or the error it raised. ``child_config`` is ``config`` with the policy's hooks in the child's own
    process; ``relay(a, b)`` there calls ``progress(a, b)`` here."""
    forced: dict[int, str] = {}
    fault_from: tuple[int, str] | None = None
    while True:
        outcome = _one_run(run, config, forced, fault_from, progress)
        if outcome.kind == "ok":
            return outcome.value  # type: ignore[no-any-return]
        if fault_from is not None:  # it failed again with the file set aside from a call on: from the start
            if fault_from[0] == 1:
                raise InternalError(f"a policy run's worker process failed with its policy file set aside "
                                    f"from the start: {outcome.reason}")  # fmt: skip
            fault_from = (1, outcome.reason)
        elif outcome.kind == "fault_from" or len(forced) >= config.max_faults:
            fault_from = (outcome.ordinal, outcome.reason)
        else:
            forced[outcome.ordinal] = outcome.reason
