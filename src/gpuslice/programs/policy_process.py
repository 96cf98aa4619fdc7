"""A policy file's hooks in their own process: the server's side of the worker (``policy_worker.py``).

Why a process: the thread guard (``guard.py``) interrupts a hook between bytecodes and abandons one
stuck in a C call that releases the GIL, but a single C call that keeps the GIL (``sum(range(10**9))``,
``[0] * 10**9``) stops every thread of the server, and nothing in a thread bounds a hook's memory. In a
process of its own a hook can burn its CPU and its memory limit and nothing else; the caller waits at
most its budget for the answer, then kills the worker, counts the fault, lets the built-in decide, and
a fresh worker is started in the background (from the same verified source, with the maps as they
were) for the calls after it.

```text
process = PolicyProcess(loaded, memory_limit)     # one worker per loaded file, started now, kept warm
instance = process.instance(args, maps)           # the policy's __init__ runs in the worker
    .call(hook, args, budget)  -> (answer, None) | (MISSING, reason)   reason: "timeout" (killed),
    .batch(hook, [args...], budget)                "memory", "crash", "invalid", "exception X",
                                                   "restarting" (no worker yet: the default decides,
                                                   not counted as a fault)
    .push_maps()    after an operator's map write: the next call sends the parent's copy
process.close()
```

A restarted worker has no instances: each is built again at its next call, from its constructor
arguments as they are then (a placement instance: its ledger as it is now) and its maps as the parent
holds them; what else the policy kept in its instance starts afresh.

Budget: as in the thread guard, what counts is CPU the hook burns, read from ``/proc/PID/stat``: past
its budget in wall time, a call is killed once the worker has burned ``CPU_SHARE`` of the budget since
the call began, or at ``WALL_CAP`` budgets of wall time whatever it burned (a worker that neither
answers nor runs is as stuck as one that spins). A worker merely waiting for a CPU on a busy machine is
not killed before that cap.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from gpuslice.errors import UserError
from gpuslice.ledger.ledger import LedgerView
from gpuslice.programs.hook_runner import CPU_SHARE, process_cpu_seconds
from gpuslice.programs.loader import LoadedPolicy, PolicyInitError
from gpuslice.programs.maps import Map
from gpuslice.programs.policy_worker import UNREPRESENTABLE, decode

__all__ = [
    "DEFAULT_MEMORY_LIMIT_BYTES",
    "MISSING",
    "START_TIMEOUT_SECONDS",
    "WALL_CAP",
    "PolicyProcess",
    "PolicyStartError",
    "RemoteInstance",
]

DEFAULT_MEMORY_LIMIT_BYTES = 512 * 2**20  # the worker's address space: Python and numpy take ~150 MiB of it
START_TIMEOUT_SECONDS = 30.0  # interpreter start, imports, verification and the policy's __init__
WALL_CAP = 10.0  # budgets of wall time after which a call is killed whatever CPU it burned
# An answer larger than this is a bad answer, not a reason to grow: decoded, it would take several times
# its size of the server's memory. A score per node of a 6,000-node cluster is about 120 KB.
_MAX_ANSWER_BYTES = 4 * 2**20
MISSING = UNREPRESENTABLE  # one sentinel: no answer, or one no check accepts


class PolicyStartError(PolicyInitError):
    """The worker could not start the policy (its ``__init__`` failed, ran too long, or ran out of memory)."""


_SPAWNER: list[ThreadPoolExecutor] = []


def _spawner() -> ThreadPoolExecutor:
    """The one long-lived thread that starts every worker. The worker asks the kernel to kill it when its
    parent dies (``PR_SET_PDEATHSIG``), and Linux means the parent *thread*: a worker started from a
    request's or a restart's thread would die with that thread."""
    if not _SPAWNER:
        _SPAWNER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuslice-policy-spawner"))
    return _SPAWNER[0]


def _forget_spawner() -> None:
    _SPAWNER.clear()  # a forked child has no spawner thread: it starts its own when it needs one


os.register_at_fork(after_in_child=_forget_spawner)


def _reap(popen: subprocess.Popen[bytes], *pipes: Connection) -> None:
    with contextlib.suppress(ProcessLookupError):
        popen.send_signal(signal.SIGKILL)
    popen.wait()
    for pipe in pipes:
        pipe.close()


class _Worker:
    """One running worker process and its two pipe ends."""

    def __init__(self) -> None:
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        env = dict(os.environ)
        # one thread per numeric library: a policy's numpy call must not spread over the server's cores
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            self.popen = (
                _spawner()
                .submit(
                    subprocess.Popen,
                    [
                        sys.executable,
                        "-m",
                        "gpuslice.programs.policy_worker",
                        str(child_read),
                        str(child_write),
                    ],
                    pass_fds=(child_read, child_write),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,  # a terminal's Ctrl-C reaches the server, which stops the worker
                )
                .result()
            )
        finally:
            os.close(child_read)
            os.close(child_write)
        self.to_worker = Connection(parent_write, readable=False)
        self.from_worker = Connection(parent_read, writable=False)
        # a worker whose owner is dropped without close() (a slot garbage-collected) is killed and reaped
        self._finalizer = weakref.finalize(self, _reap, self.popen, self.to_worker, self.from_worker)

    def kill(self) -> None:
        self._finalizer()

    def exit_reason(self) -> str:
        code = self.popen.poll()
        if code is not None and code < 0:
            return f"crash (killed by {signal.Signals(-code).name})"
        return "crash" if code is None else f"crash (exit {code})"


class PolicyProcess:
    """The worker process of one loaded policy file; see the module docstring."""

    def __init__(self, loaded: LoadedPolicy, memory_limit: int = DEFAULT_MEMORY_LIMIT_BYTES) -> None:
        self.loaded, self.memory_limit = loaded, memory_limit
        self._lock = threading.Lock()  # one request at a time on the pipe
        self._closed = False
        self._restarting: threading.Thread | None = None
        self._ids = itertools.count()
        self._forget: list[int] = []  # instances dropped in the parent, told to the worker with the next call
        self.generation = 0  # bumped by every (re)start: an instance built in an older one is built again
        self._start_failed: str | None = None  # why the last background restart failed; None once one works
        self._worker: _Worker | None = self._start()  # PolicyStartError if the file cannot start

    def instance(self, args: tuple[Any, ...], maps: dict[str, Map], budget: float) -> RemoteInstance:
        """A new instance of the policy built in the worker (PolicyStartError if its ``__init__`` fails,
        or runs past ``budget`` as a hook would)."""
        remote = RemoteInstance(self, next(self._ids), args, maps, budget)
        _, reason = remote.build()
        if reason is not None:
            spec = self.loaded
            loader_said = reason.startswith(f"policy {spec.name} ")  # PolicyInitError's own message
            raise PolicyStartError(reason if loader_said else f"policy {spec.name} ({spec.path}) could not "
                                   f"start in its worker: {reason}")  # fmt: skip
        return remote

    # -- start and restart ------------------------------------------------------------------------------
    def _start(self) -> _Worker:
        worker = _Worker()
        spec = self.loaded
        worker.to_worker.send(("start", spec.source, spec.path, spec.ops_class.__name__, self.memory_limit))
        reply, reason = self._receive(worker, START_TIMEOUT_SECONDS, START_TIMEOUT_SECONDS)
        if reason is not None or "fault" in reply:
            worker.kill()
            detail = reason or f"{reply['fault']}: {reply.get('detail', '')}"
            raise PolicyStartError(
                f"policy {spec.name} ({spec.path}) could not start in its worker: {detail}"
            )
        self.generation += 1
        return worker

    def _restart_later(self) -> None:
        """Start a fresh worker in the background; calls meanwhile answer "restarting"."""

        def run() -> None:
            try:
                worker = self._start()
            except (PolicyStartError, OSError) as err:
                # the next call answers this as a fault (one that never starts is detached) and tries again
                self._start_failed = f"crash (restart failed: {err})"
                return
            with self._lock:
                if self._closed:
                    worker.kill()
                else:
                    self._worker, self._start_failed = worker, None

        self._restarting = threading.Thread(target=run, name="gpuslice-policy-restart", daemon=True)
        self._restarting.start()

    # -- requests -----------------------------------------------------------------------------------------
    def exchange(
        self, message: Callable[[int], tuple[Any, ...] | None], budget: float, wall_cap: float
    ) -> tuple[dict[str, Any], str | None]:
        """Send ``message(generation)`` (None: nothing to send) and wait for the reply, or say why none
        came; a worker that ran past its budget or died is killed and restarted in the background."""
        with self._lock:
            worker = self._worker
            if worker is None or self._closed:
                failed, self._start_failed = self._start_failed, None
                if not self._closed and (self._restarting is None or not self._restarting.is_alive()):
                    self._restart_later()
                return {}, failed or "restarting"
            sent = message(self.generation)
            if sent is None:
                return {"ok": None}, None
            forget, self._forget = self._forget, []
            try:
                worker.to_worker.send((*sent, forget) if sent[0] in ("call", "batch") else sent)
            except OSError:  # the worker died between requests
                reason: str | None = worker.exit_reason()
                reply: dict[str, Any] = {}
            else:
                reply, reason = self._receive(worker, budget, wall_cap)
            if reason is not None:  # timeout, crash, invalid: the worker's state is unknown; a fresh one
                worker.kill()
                self._worker = None
                self._restart_later()
        return reply, reason

    def forget(self, iid: int) -> None:
        self._forget.append(iid)  # list.append is atomic; read under the lock by the next request

    def _receive(self, worker: _Worker, budget: float, wall_cap: float) -> tuple[dict[str, Any], str | None]:
        """The worker's reply, or why none came: "timeout" (past the budget, see the module docstring),
        "crash" (it died), "invalid" (a reply that is not what the worker sends)."""
        started = time.perf_counter()
        cpu_started = process_cpu_seconds(worker.popen.pid) or 0.0
        wait = budget
        while not worker.from_worker.poll(wait):
            elapsed = time.perf_counter() - started
            cpu = process_cpu_seconds(worker.popen.pid)
            if cpu is None or worker.popen.poll() is not None:
                return {}, worker.exit_reason()
            if cpu - cpu_started >= CPU_SHARE * budget or elapsed >= wall_cap:
                return {}, "timeout"
            wait = min(budget / 4, max(wall_cap - elapsed, 0.001))
        try:
            raw = worker.from_worker.recv_bytes(_MAX_ANSWER_BYTES)
        except (EOFError, OSError):
            return {}, worker.exit_reason()
        try:
            reply = json.loads(raw)
        except ValueError:
            return {}, "invalid"
        return (reply, None) if isinstance(reply, dict) else ({}, "invalid")

    def close(self) -> None:
        """Stop the worker (unload, swap, detach, shutdown)."""
        with self._lock:
            self._closed = True
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.kill()


class RemoteInstance:
    """One instance of the policy, living in the worker; the guard calls it (see the module docstring).

    ``args`` are the family's constructor arguments; a ``LedgerView`` among them (placement) is sent as
    its ledger, copied once per worker, and kept equal afterwards by the placements taken and given
    since the last call (``policy_worker.LedgerMirror``)."""

    def __init__(
        self, process: PolicyProcess, iid: int, args: tuple[Any, ...], maps: dict[str, Map], budget: float
    ) -> None:
        self.process, self.iid, self.args, self.maps = process, iid, args, maps
        self.budget = budget  # for building it (the policy's __init__), as for one hook call
        self._ledger = args[0]._ledger if args and isinstance(args[0], LedgerView) else None
        self._built_in = -1  # the worker generation this instance was built in
        self._maps_dirty = False
        weakref.finalize(self, process.forget, iid)

    def push_maps(self) -> None:
        """The parent's maps changed (an operator's write): send them with the next call."""
        self._maps_dirty = True

    def build(self) -> tuple[Any, str | None]:
        reply, reason = self.process.exchange(self._new, self.budget, self.budget * WALL_CAP)
        return self._answer(reply, reason)

    def _new(self, generation: int) -> tuple[Any, ...]:
        args = self.args
        if self._ledger is not None:
            args = (self._ledger, *args[1:])  # pickled whole below: the copy starts equal
            self._ledger.follow(self)  # and from now on the changes are recorded for the next call
        maps = {name: (m.spec(), m.dump()) for name, m in self.maps.items()}
        self._built_in, self._maps_dirty = generation, False
        return ("new", self.iid, args, maps)

    def call(self, hook: str, args: tuple[Any, ...], budget: float) -> tuple[Any, str | None]:
        return self._request("call", hook, args, budget)

    def batch(self, hook: str, calls: list[tuple[Any, ...]], budget: float) -> tuple[Any, str | None]:
        """One round trip for many calls of ``hook`` (a whole queue's sort keys): a list of answers."""
        return self._request("batch", hook, calls, budget)

    def _request(self, kind: str, hook: str, args: Any, budget: float) -> tuple[Any, str | None]:
        if self._built_in != self.process.generation:  # a restarted worker: build this instance there first
            reply, reason = self.process.exchange(self._new, self.budget, self.budget * WALL_CAP)
            if reason is None and "fault" in reply:
                reason = (
                    "crash (could not build the policy again: " + str(reply.get("detail", ""))[:200] + ")"
                )
            if reason is not None:
                self._built_in = -1
                return MISSING, reason

        def message(generation: int) -> tuple[Any, ...]:
            maps = None
            if self._maps_dirty:
                maps, self._maps_dirty = {name: m.dump() for name, m in self.maps.items()}, False
            if self._ledger is not None:
                sent = [(None, *a[1:]) for a in args] if kind == "batch" else (None, *args[1:])
                return (kind, self.iid, hook, sent, maps, self._sync())
            return (kind, self.iid, hook, args, maps, None)

        reply, reason = self.process.exchange(message, budget, budget * WALL_CAP)
        if reason is not None:
            self._built_in = -1  # the worker is gone; the next call builds this instance in the new one
        return self._answer(reply, reason)

    def _sync(self) -> list[tuple[int, Any]] | None:
        """The placements the parent's ledger took and gave back since the worker's copy last saw it."""
        return self._ledger.changes(self) or None  # type: ignore[union-attr]

    def _answer(self, reply: dict[str, Any], reason: str | None) -> tuple[Any, str | None]:
        if reason is None and "fault" in reply:
            reason = reply["fault"]
            if reason == "exception PolicyInitError":
                reason = str(reply.get("detail", ""))  # the loader's own message, as in process
        if reason is not None:
            return MISSING, reason
        self._merge_maps(reply.get("maps"))
        return decode(reply.get("ok")), None

    def _merge_maps(self, state: Any) -> None:
        """The maps as the hook left them: the parent's copies follow (their own checks apply)."""
        if not isinstance(state, dict):
            return
        for name, pairs in state.items():
            live = self.maps.get(name)
            if live is None or not isinstance(pairs, list):
                continue
            try:
                fresh = Map.from_spec(live.spec())
                fresh.load((k, v) for k, v in pairs)
            except (ValueError, TypeError, UserError):
                continue  # a state the map's own rules refuse is dropped, the old one kept
            live.clear()
            live.load(fresh.dump())
