"""Sizes: parsed at the edge into integer bytes, formatted back for people.

Inside gpuslice every size is an ``int`` number of bytes. Users write "8GiB", "8000MiB", "8G" or a bare
number of bytes. Decimal suffixes (kB, MB, GB, TB) are powers of 1000 and binary ones (KiB … TiB) powers
of 1024; a bare single letter (K, M, G, T) follows Kubernetes and nvidia-smi usage and means the binary
unit, which is what people mean when they say "an 8G slice".
"""

from __future__ import annotations

import re

from gpuslice.errors import InvalidSize

__all__ = ["GiB", "KiB", "MiB", "TiB", "format_size", "parse_size"]

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 1000,
    "m": MiB,
    "mib": MiB,
    "mb": 1000**2,
    "g": GiB,
    "gib": GiB,
    "gb": 1000**3,
    "t": TiB,
    "tib": TiB,
    "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_HINT = "use a number and a unit, e.g. 8GiB, 8000MiB, 8G"


def parse_size(text: str | int) -> int:
    """Bytes in ``text`` ("8GiB", "8000MiB", "8G", "1.5GiB", "4096"); raises InvalidSize otherwise."""
    if isinstance(text, bool):
        raise InvalidSize(f"invalid size {text!r}: {_HINT}")
    if isinstance(text, int):
        if text < 0:
            raise InvalidSize(f"invalid size {text}: sizes cannot be negative")
        return text
    match = _SIZE.match(str(text))
    if match is None:
        raise InvalidSize(f"invalid size {text!r}: {_HINT}")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise InvalidSize(f"invalid size {text!r}: unknown unit {unit!r}; {_HINT}")
    value = float(number) * factor
    if value != int(value):
        raise InvalidSize(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(size_bytes: int) -> str:
    """The largest binary unit that keeps the number at or above 1: 8589934592 -> '8 GiB'."""
    for unit, factor in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(size_bytes) >= factor:
            value = size_bytes / factor
            text = f"{value:.1f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
    return f"{size_bytes} B"
