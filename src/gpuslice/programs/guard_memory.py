"""The runtime guard for memory policies (eviction and prefetch): the hooks' checks and the guarded class.

Kept apart from ``guard.py`` so that guarding a placement or queue policy never imports the memory engine;
``guard.guard`` imports this module only for the memory families. Each hook runs through the same
``_guarded`` call as every other family (timed, checked, the default deciding on a fault); a hook that
fails after recording a request in its decision context has that request cleared first.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from gpuslice.memory.hooks import DecisionContext, EvictContext, MemoryOps
from gpuslice.programs.guard import _MISSING, HookGuard, _guarded

__all__ = ["GuardedMemory", "guarded_memory"]


def _reset_request(args: tuple[Any, ...]) -> None:
    """Forget the request a faulty hook recorded in its decision context (always the last argument)."""
    ctx = args[-1]
    ctx._request = None  # the guard is the mechanism's side: it may clear a faulty hook's request
    ctx._conflict = False


def _reset_moves(args: tuple[Any, ...]) -> None:
    args[-1].moves.clear()


def _int_in(allowed: tuple[int, ...]) -> Callable[[Any], Any]:
    def check(answer: Any) -> Any:
        ok = isinstance(answer, int | np.integer) and not isinstance(answer, bool) and answer in allowed
        return int(answer) if ok else _MISSING

    return check


_ACCESS_ACTIONS = _int_in((0, 1))  # DEFAULT, BYPASS
_PREFETCH_ACTIONS = _int_in((0, 1, 2))  # DEFAULT, BYPASS, ENTER_LOOP
_ITER_ACTIONS = _int_in((0, 1))


def _init(self: Any, view: Any) -> None:
    _guarded(self, "init", (view,), None)


def _block_activate(self: Any, view: Any, block: int, ctx: DecisionContext) -> None:
    _guarded(self, "block_activate", (view, block, ctx), None, _reset_request)


def _block_access(self: Any, view: Any, block: int, hits: int, ctx: DecisionContext) -> int:
    return _guarded(self, "block_access", (view, block, hits, ctx), _ACCESS_ACTIONS, _reset_request)


def _evict_prepare(self: Any, view: Any, ctx: EvictContext) -> None:
    _guarded(self, "evict_prepare", (view, ctx), None, _reset_moves)


def _page_prefetch(self: Any, view: Any, fault: Any, ctx: DecisionContext) -> int:
    return _guarded(self, "page_prefetch", (view, fault, ctx), _PREFETCH_ACTIONS, _reset_request)


def _page_prefetch_iter(
    self: Any, view: Any, fault: Any, first: int, outer: int, counter: int, ctx: DecisionContext
) -> int:
    args = (view, fault, first, outer, counter, ctx)
    return _guarded(self, "page_prefetch_iter", args, _ITER_ACTIONS, _reset_request)


_MEMORY_HOOKS: dict[str, Callable[..., Any]] = {
    "init": _init,
    "block_activate": _block_activate,
    "block_access": _block_access,
    "evict_prepare": _evict_prepare,
    "page_prefetch": _page_prefetch,
    "page_prefetch_iter": _page_prefetch_iter,
}


class GuardedMemory(MemoryOps):
    """A loaded memory policy behind the guard. ``guard()`` builds a subclass per policy class holding
    only the hooks that policy overrides, because the simulator skips hooks left to the driver (so a
    guarded policy runs the same code paths as the bare one)."""

    def __init__(self, policy: MemoryOps, default: MemoryOps, guard: HookGuard) -> None:
        self.policy, self.default, self.guard = policy, default, guard
        self.inherited: set[str] = set()  # the class holds only the policy's own hooks (_memory_class)
        self.name = policy.name  # type: ignore[misc]
        self.summary = policy.summary  # type: ignore[misc]
        self.kind = policy.kind  # type: ignore[misc]


_MEMORY_CLASSES: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()


def _memory_class(policy_class: type) -> type:
    cls = _MEMORY_CLASSES.get(policy_class)
    if cls is None:
        own = {
            h: f for h, f in _MEMORY_HOOKS.items() if getattr(policy_class, h) is not getattr(MemoryOps, h)
        }
        cls = _MEMORY_CLASSES[policy_class] = type(f"Guarded{policy_class.__name__}", (GuardedMemory,), own)
    return cls


def guarded_memory(policy: MemoryOps, default: MemoryOps, hook_guard: HookGuard) -> GuardedMemory:
    """``policy`` behind ``hook_guard``, ``default`` deciding on faults."""
    return _memory_class(type(policy))(policy, default, hook_guard)
