"""One family's active policy in a running system, swapped atomically between decisions.

```text
slot = PolicySlot("queue", default_factory=queue_policy(DEFAULT_QUEUE_POLICY), on_event=store.event)
with slot.lock:                       # or slot.decide("order_key", view, job)
    ops = slot.current                # the default, or the loaded policy behind its guard
    ... one decision ...
slot.swap(load_file("p.py"))          # verified already; instantiated and guarded outside the lock,
                                      # then one assignment under the lock: lands between decisions
slot.unload()                         # the built-in default again
slot.map_update("boost", "alice", "1")   # bpftool map update, for the policy's declared maps
```

Maps carry over a swap when the new version declares a map of the same name with the same ``MapSpec``
(gpu_ext's maps outlive a program that is replaced while pinned); other maps start empty. When the
guard detaches a faulty policy the slot puts the default back at once, and ``info()`` still describes
the detached policy (``detached: true``) until the next load or unload.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gpuslice.errors import InternalError, NotFound
from gpuslice.programs.guard import GuardConfig, file_info, guard
from gpuslice.programs.guard_isolated import ISOLATED_FAMILIES, isolated
from gpuslice.programs.loader import LoadedPolicy, PolicyFamilyMismatch
from gpuslice.programs.maps import Map
from gpuslice.programs.policy_process import PolicyProcess
from gpuslice.programs.verify import FAMILIES

__all__ = ["NoPolicyLoaded", "NoSuchMap", "PolicySlot"]


class NoPolicyLoaded(NotFound):
    """A map or unload request for a family whose slot holds only the built-in default."""


class NoSuchMap(NotFound):
    """A map name the loaded policy does not declare."""


class PolicySlot:
    """The active ops of one family (``family`` in placement, queue, eviction, prefetch).

    ``default_factory(*args)`` builds the built-in default; a loaded policy is built with the same
    ``args`` (placement: ``(view, context)``; queue and memory: none)."""

    def __init__(
        self,
        family: str,
        default_factory: Callable[..., Any],
        guard_config: GuardConfig | None = None,
        on_event: Callable[[str], None] | None = None,
        args: tuple[Any, ...] = (),
    ) -> None:
        if family not in FAMILIES:
            # the family comes from the code that builds the slot, never from a user: a bug
            raise InternalError(f"bug: unknown policy family {family!r}; known: {', '.join(FAMILIES)}")
        self.family = family
        self.lock = threading.RLock()  # re-entrant: a detach happens inside a decision made under it
        self._args = args
        self._default = default_factory(*args)
        self._guard_config = guard_config or GuardConfig()
        self._on_event = on_event
        self._current: Any = self._default
        self._loaded: LoadedPolicy | None = None
        self._guarded: Any = None
        self._maps: dict[str, Map] = {}
        self._loaded_at: float | None = None

    @property
    def current(self) -> Any:
        """The ops instance to call for the next decision."""
        return self._current

    def decide(self, hook: str, *args: Any) -> Any:
        """Call ``hook`` of the current ops under the lock (a swap lands before or after, never during)."""
        with self.lock:
            return getattr(self._current, hook)(*args)

    # -- load / unload --------------------------------------------------------------------------------
    def swap(self, loaded: LoadedPolicy) -> None:
        """Make ``loaded`` the active policy. Everything that can fail (family check, maps, the policy's
        ``__init__``) happens before the lock is taken, so a failed swap changes nothing."""
        if loaded.family != self.family:
            raise PolicyFamilyMismatch(
                f"{loaded.path} is a {loaded.family} policy; this slot holds the {self.family} policy"
            )
        with self.lock:
            previous = dict(self._maps)
        maps = loaded.new_maps()
        carried = [n for n, m in previous.items() if n in maps and m.spec() == maps[n].spec()]
        for name in carried:
            maps[name] = previous[name]
        if self._guard_config.isolate and self.family in ISOLATED_FAMILIES:
            # the policy's __init__ and every hook run in its worker process (PolicyStartError here)
            process = PolicyProcess(loaded, self._guard_config.memory_limit_bytes)
            try:
                guarded = isolated(
                    process,
                    self._args,
                    maps,
                    self._default,
                    self._guard_config,
                    self._on_event,
                    self._detached,
                )
            except BaseException:
                process.close()
                raise
        else:
            policy = loaded.instantiate(*self._args, maps=maps)
            guarded = guard(
                self.family, policy, self._default, self._guard_config, self._on_event, self._detached
            )
        with self.lock:
            previous_guarded = self._guarded
            self._current, self._guarded, self._loaded = guarded, guarded, loaded
            self._maps, self._loaded_at = maps, time.time()
        _stop_worker(previous_guarded)
        kept = f"; maps carried over: {', '.join(carried)}" if carried else ""
        self._emit(
            f"policy {loaded.name} ({self.family}) loaded from {loaded.path}, "
            f"sha256 {loaded.sha256[:12]}{kept}"
        )

    def unload(self) -> None:
        """Put the built-in default back; NoPolicyLoaded if there is nothing to unload."""
        with self.lock:
            if self._loaded is None:
                raise NoPolicyLoaded(f"no {self.family} policy is loaded; the built-in default is active")
            name, previous_guarded = self._loaded.name, self._guarded
            self._current, self._guarded, self._loaded, self._maps, self._loaded_at = (
                self._default,
                None,
                None,
                {},
                None,
            )
        _stop_worker(previous_guarded)
        self._emit(f"policy {name} ({self.family}) unloaded; the built-in default is active")

    def _detached(self) -> None:
        with self.lock:
            self._current = self._default

    def _emit(self, text: str) -> None:
        if self._on_event is not None:
            self._on_event(text)

    # -- inspection -----------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """What is active: the default's name, or the loaded file's name, hash, path, faults and maps."""
        with self.lock:
            loaded, guarded = self._loaded, self._guarded
            if loaded is None:
                return {"family": self.family, "name": self._default.name, "builtin": True, "detached": False}
            maps = {n: m.spec().as_dict() | {"entries": len(m)} for n, m in self._maps.items()}
            return file_info(loaded, self._loaded_at, guarded.guard) | {"maps": maps}

    # -- maps -----------------------------------------------------------------------------------------
    def _map(self, name: str) -> Map:
        if self._loaded is None:
            raise NoPolicyLoaded(f"no {self.family} policy is loaded, so there are no maps")
        if name not in self._maps:
            known = ", ".join(self._maps) or "none"
            raise NoSuchMap(f"policy {self._loaded.name} has no map {name!r}; its maps: {known}")
        return self._maps[name]

    def map_get(self, name: str, key: Any) -> Any:
        """The value under ``key`` (text is parsed as the map's key type); None if absent."""
        with self.lock:
            m = self._map(name)
            return m.get(_as(m.parse_key, m.spec().key, key))

    def map_update(self, name: str, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` (texts parsed as the map's types); MapError/MapFull on bad input."""
        with self.lock:
            m = self._map(name)
            m.update(_as(m.parse_key, m.spec().key, key), _as(m.parse_value, m.spec().value, value))
            self._maps_changed()

    def map_delete(self, name: str, key: Any) -> bool:
        with self.lock:
            m = self._map(name)
            deleted = m.delete(_as(m.parse_key, m.spec().key, key))
            self._maps_changed()
            return deleted

    def _maps_changed(self) -> None:
        """A policy in a worker process gets the slot's maps with its next call."""
        remote = getattr(getattr(self._guarded, "guard", None), "remote", None)
        if remote is not None:
            remote.push_maps()

    def close(self) -> None:
        """Stop a loaded policy's worker process (the server is shutting down)."""
        with self.lock:
            guarded = self._guarded
        _stop_worker(guarded)

    def map_dump(self, name: str) -> list[tuple[Any, Any]]:
        with self.lock:
            return self._map(name).dump()


def _stop_worker(guarded: Any) -> None:
    """Stop the worker process of a policy being replaced or unloaded (none for in-process policies)."""
    process = getattr(getattr(guarded, "guard", None), "process", None)
    if process is not None:
        process.close()


def _as(parse: Callable[[str], Any], tp: type, item: Any) -> Any:
    """Text from the CLI or REST parsed as ``tp``; typed values pass through to the map's own check."""
    if isinstance(item, str) and tp is not str:
        return parse(item)
    return item
