"""The guard for a policy file whose hooks run in a worker process (``policy_process.py``).

The same wrappers, checks and fault-then-detach rule as ``guard.py``; only where a call runs differs:
``IsolatedGuard.call`` sends it to the worker and waits at most the budget (the worker is killed past
it), so a hook that holds the GIL in one C call, or allocates gigabytes, costs one decision and the
worker, never the server's threads or memory. Detaching stops the instance's use of the worker.

Placement and queue files are isolated (``ISOLATED_FAMILIES``). Queue hooks get a ``QueueView`` and
queued jobs, which pickle in microseconds, and ``order_keys`` orders a whole queue in one round trip;
placement hooks read the worker's copy of the ledger, kept equal by replaying placements. This is how a
server runs a file; a batch run (a replay, memsim, whose memory hooks are called per page fault) sends
its whole run to one worker instead (``run_isolation.py``).

``policy`` in a wrapper is an instance of the file's class made without its ``__init__`` (the base
class's constructor sets the view it reads): only the hooks it inherits from the family's base class,
the project's own code, run in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuslice.advice import Fallback
from gpuslice.policies.queue.base import QueuedJob, QueueView
from gpuslice.programs.guard import (
    _MISSING,
    GuardConfig,
    GuardedFactory,
    GuardedPlacement,
    GuardedQueue,
    HookGuard,
    _checked_key,
    family_default,
)
from gpuslice.programs.loader import LoadedPolicy
from gpuslice.programs.maps import Map
from gpuslice.programs.policy_process import MISSING, PolicyProcess, RemoteInstance

__all__ = ["ISOLATED_FAMILIES", "IsolatedGuard", "IsolatedQueue", "isolated", "isolated_factory"]

NOT_A_FAULT = Fallback.RESTARTING  # no worker yet after a kill: the default decides; no step to detach


class IsolatedGuard(HookGuard):
    """A ``HookGuard`` whose calls go to one policy instance in the worker process."""

    def __init__(
        self,
        remote: RemoteInstance,
        family: str,
        name: str,
        config: GuardConfig,
        on_event: Callable[[str], None] | None,
        on_detach: Callable[[], None] | None,
    ) -> None:
        self.remote = remote
        super().__init__(family, name, config.without_interrupt(), on_event, on_detach)

    @property
    def process(self) -> PolicyProcess:
        return self.remote.process

    def call(self, hook: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, str | None]:
        self.calls += 1
        answer, reason = self.remote.call(hook, args, self.budget)
        return (_MISSING, reason) if answer is MISSING or reason is not None else (answer, None)

    def batch(self, hook: str, calls: list[tuple[Any, ...]]) -> tuple[Any, str | None]:
        self.calls += 1
        answer, reason = self.remote.batch(hook, calls, self.budget)
        return (_MISSING, reason) if answer is MISSING or reason is not None else (answer, None)

    def fault(self, hook: str, reason: str) -> None:
        if reason == NOT_A_FAULT:  # counted where fallbacks are read, but no event and no step to detach
            self.faults[(hook, NOT_A_FAULT)] += 1
            return
        super().fault(hook, reason)


class IsolatedQueue(GuardedQueue):
    """A queue policy file in its worker process."""

    def _read_only(self, view: QueueView) -> QueueView:
        return view  # the worker gets a copy; nothing it does reaches the server's view

    def order_keys(self, view: QueueView, jobs: list[QueuedJob]) -> list[tuple[Any, ...]]:
        """Every job's sort key in one call to the worker; any fault or bad key: the default's keys."""
        g: IsolatedGuard = self.guard  # type: ignore[assignment]
        if not g.detached and "order_key" not in self.inherited:
            answer, reason = g.batch("order_key", [(view, job) for job in jobs])
            if reason is None:
                keys = [_checked_key(k) for k in answer] if isinstance(answer, list) else [_MISSING]
                if len(keys) == len(jobs) and all(k is not _MISSING for k in keys):
                    return keys
                reason = Fallback.INVALID
            g.fault("order_key", reason)
        ops = self.policy if not g.detached and "order_key" in self.inherited else self.default
        return [ops.order_key(view, job) for job in jobs]


_WRAPPERS: dict[str, Callable[..., Any]] = {"placement": GuardedPlacement, "queue": IsolatedQueue}
ISOLATED_FAMILIES = frozenset(_WRAPPERS)


def isolated(
    process: PolicyProcess,
    args: tuple[Any, ...],
    maps: dict[str, Map],
    default: Any,
    config: GuardConfig,
    on_event: Callable[[str], None] | None = None,
    on_detach: Callable[[], None] | None = None,
) -> Any:
    """A new instance of ``process``'s file, built in its worker (PolicyStartError if its ``__init__``
    fails there), behind the family's guard wrapper with ``default`` deciding on faults."""
    loaded = process.loaded
    remote = process.instance(args, maps, config.budget_for(loaded.family))
    shell = object.__new__(loaded.ops_class)
    family_default(loaded.family).__init__(shell, *args)  # the base class's own: placement keeps the view
    hook_guard = IsolatedGuard(remote, loaded.family, loaded.name, config, on_event, on_detach)
    return _WRAPPERS[loaded.family](shell, default, hook_guard)


def isolated_factory(
    loaded: LoadedPolicy, config: GuardConfig, on_event: Callable[[str], None] | None = None
) -> Callable[..., Any]:
    """``guard.guarded_factory`` for an isolated family: one worker for the file, started now (so that a
    file that cannot start is refused before anything runs), and each instance built there."""
    process = PolicyProcess(loaded, config.memory_limit_bytes)
    default_factory = family_default(loaded.family)

    def build(*args: Any) -> Any:
        return isolated(process, args, loaded.new_maps(), default_factory(*args), config, on_event)

    return GuardedFactory(loaded, build, process)
