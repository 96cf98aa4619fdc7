"""Bounded typed maps: the state a policy program declares, the counterpart of gpu_ext's BPF maps.

A policy file declares its maps where the verifier can see them, at module level or in the ops class
body::

    freq = Map(key=int, value=int, max_entries=65536)

The loader gives each running instance fresh maps (or, on a hot swap, the previous version's maps when
the new version declares a map of the same name with the same ``MapSpec``), and a running server reads
and writes them by name (``gpuslice policy map get|update|dump``, like ``bpftool map update``).

Why bounded and typed: gpu_ext's maps have a fixed key/value layout and ``max_entries`` (its
``extension/*.bpf.c``: HASH maps of 4096–100 000 entries), so a policy's memory is known when it is loaded and
an operator can read or change its state without knowing the code. Keys and values are ``int``, ``float``,
``str`` or ``bool``; an ``int`` is accepted where a ``float`` is declared (it is stored as a float), a
``bool`` is never taken for an ``int``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gpuslice.errors import UserError

__all__ = ["MAP_TYPES", "Map", "MapError", "MapFull", "MapSpec"]

MAP_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}
MAX_ENTRIES_LIMIT = 1 << 24  # 16 M entries: beyond any gpu_ext map, a typo guard


class MapError(UserError):
    """A key or value of the wrong type, or a map declared with an unsupported type or size."""


class MapFull(MapError):
    """An update would add an entry beyond the map's ``max_entries``."""


@dataclass(frozen=True)
class MapSpec:
    """A map's layout: key type, value type, and the most entries it may hold."""

    key: type
    value: type
    max_entries: int

    def __str__(self) -> str:
        return f"Map(key={self.key.__name__}, value={self.value.__name__}, max_entries={self.max_entries})"

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key.__name__, "value": self.value.__name__, "max_entries": self.max_entries}


def _check_type(role: str, tp: Any) -> type:
    if tp not in MAP_TYPES.values():
        raise MapError(f"map {role} type {tp!r} is not supported: use int, float, str or bool")
    return tp


def _coerce(role: str, tp: type, item: Any) -> Any:
    """``item`` as ``tp``; ints widen to float, nothing else converts (a bool is not an int here)."""
    if type(item) is tp:
        return item
    if tp is float and type(item) is int:
        return float(item)
    raise MapError(f"map {role} {item!r} is a {type(item).__name__}, the map holds {tp.__name__}")


def _parse(role: str, tp: type, text: str) -> Any:
    """A CLI/REST string as ``tp`` ("true"/"false"/"1"/"0" for bool)."""
    try:
        if tp is bool:
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return lowered in ("true", "1")
        return tp(text)
    except ValueError:
        raise MapError(f"map {role} {text!r} is not a {tp.__name__}") from None


class Map:
    """A dict with a declared key type, value type and size limit; the only state a policy carries.

    Reads never fail (``get`` returns ``default`` for a missing key); a write of the wrong type raises
    ``MapError`` and a write of a new key into a full map raises ``MapFull`` — inside a hook, either is
    an exception the guard counts, and the default decides.
    """

    __slots__ = ("_data", "_spec")

    def __init__(self, key: type = int, value: type = float, max_entries: int = 4096) -> None:
        if type(max_entries) is not int or not 1 <= max_entries <= MAX_ENTRIES_LIMIT:
            raise MapError(f"map max_entries {max_entries!r} must be an int from 1 to {MAX_ENTRIES_LIMIT}")
        self._spec = MapSpec(_check_type("key", key), _check_type("value", value), max_entries)
        self._data: dict[Any, Any] = {}

    @classmethod
    def from_spec(cls, spec: MapSpec) -> Map:
        return cls(spec.key, spec.value, spec.max_entries)

    def spec(self) -> MapSpec:
        return self._spec

    def get(self, key: Any, default: Any = None) -> Any:
        return self._data.get(key, default)

    def update(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` (the ``bpf_map_update_elem`` of a policy)."""
        spec = self._spec
        key = _coerce("key", spec.key, key)
        value = _coerce("value", spec.value, value)
        data = self._data
        if key not in data and len(data) >= spec.max_entries:
            raise MapFull(f"map is full ({spec.max_entries} entries): key {key!r} not added")
        data[key] = value

    def delete(self, key: Any) -> bool:
        """Remove ``key``; True if it was there."""
        return self._data.pop(key, _MISSING) is not _MISSING

    def clear(self) -> None:
        self._data.clear()

    def items(self) -> list[tuple[Any, Any]]:
        """A copy of the entries (a hook may update the map while walking it)."""
        return list(self._data.items())

    def keys(self) -> list[Any]:
        return list(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._data))

    def __repr__(self) -> str:
        return f"<{self._spec} with {len(self._data)} entries>"

    # -- for the operator: dump, load, text parsing --------------------------------------------------
    def dump(self) -> list[tuple[Any, Any]]:
        """Every entry, sorted by key (stable output for ``map dump``)."""
        return sorted(self._data.items(), key=lambda kv: kv[0])

    def load(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        """Replace the contents with ``pairs``, all checked first: on any error nothing changes."""
        spec = self._spec
        fresh: dict[Any, Any] = {}
        for key, value in pairs:
            fresh[_coerce("key", spec.key, key)] = _coerce("value", spec.value, value)
        if len(fresh) > spec.max_entries:
            raise MapFull(f"{len(fresh)} entries do not fit a map of {spec.max_entries}")
        self._data = fresh

    def parse_key(self, text: str) -> Any:
        return _parse("key", self._spec.key, text)

    def parse_value(self, text: str) -> Any:
        return _parse("value", self._spec.value, text)


_MISSING = object()
