"""Policies as programs in the serve daemon: what runs per family, swaps, unloads and map access.

A policy file is loaded like a sched_ext scheduler or a BPF program: verified, run under a guard, and
swapped in while serving; its maps are read and written from outside as ``bpftool map`` does (``Daemon``
holds one ``PolicyAdmin``). The scheduler's policy is only assigned under the daemon's lock, which a
scheduling pass holds from start to end, and map writes take it too: a swap, an unload or a map write
lands between two passes, never inside one (no pass orders half its jobs with one policy and half with
the next).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from gpuslice.policies import placement_policy
from gpuslice.policies.queue import DEFAULT_QUEUE_POLICY, queue_policy
from gpuslice.programs.guard import GuardConfig, GuardedFactory
from gpuslice.programs.loader import LoadedPolicy, PolicyFamilyMismatch, is_policy_path, load_file, resolve
from gpuslice.programs.maps import MAP_TYPES, Map
from gpuslice.programs.slot import PolicySlot
from gpuslice.server.errors import PolicyNotFound
from gpuslice.server.store import Store

__all__ = ["PolicyAdmin", "queue_slot"]


def queue_slot(name_or_file: str, guard: GuardConfig, on_event: Callable[[str], None]) -> PolicySlot:
    """The queue family's slot: a built-in by name, or a policy file loaded as if by `policy load` (the
    built-in default stays behind it, for unload and for the guard to fall back to)."""
    from_file = is_policy_path(name_or_file)
    slot = PolicySlot(
        "queue",
        queue_policy(DEFAULT_QUEUE_POLICY if from_file else name_or_file),
        guard,
        on_event=on_event,
    )
    if from_file:
        slot.swap(load_file(name_or_file))
    return slot


class PolicyAdmin:
    """The serve daemon's policies: ``GET/POST/DELETE /v1/policies`` and the map calls.

    Owns each family's slot, the placement policy fixed at start, and the guard events waiting to be
    written. Guard events (fault, detached, …) come from inside a scheduling pass, when the daemon's lock
    is held; they wait in ``_events`` until the lock holder writes them to the store (``flush_events``).
    ``lock`` and ``wake`` are the daemon's; ``on_swap`` is called under the lock after a load or an
    unload, so that the scheduler takes the family's new policy before the next pass.
    """

    def __init__(
        self,
        store: Store,
        *,
        queue_policy: str,
        placement: str,
        guard: GuardConfig,
        lock: threading.RLock,
        wake: threading.Event,
        clock: Callable[[], float],
        on_swap: Callable[[], None],
    ) -> None:
        self._store = store
        self._lock = lock
        self._wake = wake
        self._clock = clock
        self._on_swap = on_swap
        self._events: deque[tuple[str, str]] = deque()
        # The queue policy the scheduler calls is the slot's current one: a built-in, or a policy file
        # (verified, guarded) swapped in while serving.
        self.slots: dict[str, PolicySlot] = {
            "queue": queue_slot(queue_policy, guard, lambda message: self._events.append(("queue", message)))
        }
        # The placement policy (a name, or a file verified and guarded here) advises which GPUs a job
        # gets, through the same placer as sim and the Kubernetes extender.
        self.placement = placement  # the placement policy's name, or the file given at start
        self.placement_factory: Any = resolve(  # a GuardedFactory for a file
            placement,
            "placement",
            placement_policy,
            guard,
            on_event=lambda message: self._events.append(("placement", message)),
        )

    @property
    def queue_policy(self) -> Any:
        """The queue policy the scheduler calls now (the guard falls back to the built-in by itself)."""
        return self.slots["queue"].current

    def close(self) -> None:
        """End the policy files' worker processes (they would also die with this process)."""
        for slot in self.slots.values():
            slot.close()
        if isinstance(self.placement_factory, GuardedFactory):
            self.placement_factory.close()

    def policies(self) -> list[dict[str, Any]]:
        """Each family's slot as the API shows it (``PolicyOut``): what runs, its faults, its maps; then
        the placement policy (fixed at start, so not a slot: its file's faults and detach show here)."""
        with self._lock:
            self.flush_events(self._clock())
            return [*(_policy_out(slot.info()) for slot in self.slots.values()), self._placement_out()]

    def _placement_out(self) -> dict[str, Any]:
        factory = self.placement_factory
        if not isinstance(factory, GuardedFactory):
            built_in = {"family": "placement", "name": self.placement, "builtin": True, "detached": False}
            return _policy_out(built_in)
        return _policy_out(factory.info())

    def load_policy(self, loaded: LoadedPolicy) -> dict[str, Any]:
        """Swap a verified policy in for its family; maps of the same name and spec keep their entries."""
        if loaded.family not in self.slots:
            raise PolicyFamilyMismatch(
                f"{loaded.path} is a {loaded.family} policy; this server runs {', '.join(self.slots)} "
                "policies from `policy load` (a placement policy file is given at start: serve --placement "
                "FILE; memory policies load into memsim)"
            )
        slot = self.slots[loaded.family]
        # The slot builds the new instance (maps, __init__) before it assigns: a failure changes nothing.
        # The scheduler takes the new one under the daemon's lock, so the pass in progress ends with the
        # policy it started with.
        slot.swap(loaded)
        with self._lock:
            self._on_swap()
            self.flush_events(self._clock())
            self._wake.set()
            return _policy_out(slot.info())

    def unload_policy(self, family: str) -> dict[str, Any]:
        """Back to the family's built-in policy; NoPolicyLoaded when it runs already."""
        slot = self._slot(family)
        slot.unload()
        with self._lock:
            self._on_swap()
            self.flush_events(self._clock())
            self._wake.set()
            return _policy_out(slot.info())

    def policy_map(self, family: str, name: str) -> dict[str, Any]:
        """Every entry of one map of the loaded policy, sorted by key (``MapOut``)."""
        slot = self._slot(family)
        with self._lock:
            entries = slot.map_dump(name)  # NoPolicyLoaded / NoSuchMap first
            spec = _spec_out(slot.info()["maps"][name])
            return {"family": family, "name": name, **spec, "entries": entries}

    def policy_map_get(self, family: str, name: str, key: str) -> dict[str, Any]:
        """One entry (``MapEntryOut``); ``key`` is text, parsed as the map's key type."""
        slot = self._slot(family)
        with self._lock:
            value = slot.map_get(name, key)
            if value is None:  # map values are never None: the key is absent
                raise PolicyNotFound(f"map {name} has no key {key!r}; `policy map dump {name}` lists them")
            return {"family": family, "map": name, "key": _typed_key(slot, name, key), "value": value}

    def policy_map_update(self, family: str, name: str, key: str, value: Any) -> dict[str, Any]:
        """Write one entry; the policy reads it from the next pass on (``bpftool map update``). ``value``
        is text to parse as the map's value type, or a JSON number/bool of that type."""
        slot = self._slot(family)
        with self._lock:
            previous = slot.map_get(name, key)
            # MapError, and nothing written, for a key or value of another type than the map's
            slot.map_update(name, key, value)
            self._wake.set()
            return {"family": family, "map": name, "key": _typed_key(slot, name, key),
                    "value": slot.map_get(name, key), "previous": previous}  # fmt: skip

    def policy_map_delete(self, family: str, name: str, key: str) -> dict[str, Any]:
        """Remove one entry (``bpftool map delete``); PolicyNotFound when the key is not there."""
        slot = self._slot(family)
        with self._lock:
            previous = slot.map_get(name, key)
            if previous is None or not slot.map_delete(name, key):
                raise PolicyNotFound(f"map {name} has no key {key!r}; `policy map dump {name}` lists them")
            self._wake.set()
            return {"family": family, "map": name, "key": _typed_key(slot, name, key), "value": previous}

    def _slot(self, family: str) -> PolicySlot:
        slot = self.slots.get(family)
        if slot is None and family == "placement":
            raise PolicyNotFound(
                f"the placement policy ({self.placement}) is fixed at the server's start: restart it with "
                "serve --placement NAME|FILE to change it; it has no maps to read or write here"
            )
        if slot is None:
            served = ", ".join(sorted(self.slots))
            raise PolicyNotFound(f"this server runs no {family} policy; its policy families: {served}")
        return slot

    def flush_events(self, now: float) -> None:
        """Write the guard events waiting since the last flush (call with the daemon's lock held)."""
        while self._events:
            family, message = self._events.popleft()
            self._store.event(None, "policy", message, now, {"family": family})


def _spec_out(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A map's layout from the slot's ``info()`` (key, value, max_entries) in the API's names."""
    return {"key_type": spec["key"], "value_type": spec["value"], "max_entries": spec["max_entries"]}


def _typed_key(slot: PolicySlot, name: str, key: str) -> Any:
    """``key`` as the map stores it (the text "3" is the int 3 in an int-keyed map)."""
    spec = slot.info()["maps"][name]
    return Map(MAP_TYPES[spec["key"]], MAP_TYPES[spec["value"]], 1).parse_key(key)


def _policy_out(info: Mapping[str, Any]) -> dict[str, Any]:
    """A slot's ``info()`` in the API's shape (``PolicyOut``); the built-in has no file, faults or maps."""
    faults = []
    for hook_reason, n in sorted(info.get("faults", {}).items()):
        hook, _, reason = hook_reason.partition(":")
        faults.append({"hook": hook, "reason": reason, "count": n})
    return {
        "family": info["family"],
        "name": info["name"],
        "builtin": info["builtin"],
        "source": info.get("path"),
        "sha256": info.get("sha256"),
        "loaded_at": info.get("loaded_at"),
        "detached": info["detached"],
        "faults": faults,
        "maps": [
            {"name": name, **_spec_out(spec), "entries": spec["entries"]}
            for name, spec in sorted(info.get("maps", {}).items())
        ],
    }
