"""Sizes: parsed at the edge into integer bytes, formatted back for people.

Inside gpuslice every size is an ``int`` number of bytes. The one rule for sizes people write:

- a number and a unit: "8GiB", "8000MiB", "1.5GiB", "8G", "100B";
- binary units (KiB, MiB, GiB, TiB) are powers of 1024 and decimal ones (kB, MB, GB, TB) powers of 1000,
  so "20GB" is 20,000,000,000 bytes (18.6 GiB);
- a single letter (K, M, G, T) means the binary unit, as nvidia-smi, PyTorch and most people mean it
  when they say "an 8G slice" (Kubernetes quantities differ: there G is 10^9 and Gi is 2^30);
- a bare number is refused: "20" could be bytes or GiB, and a 20-byte slice is never what was meant
  (write "20B" for bytes); so is zero, and so are digits other than ASCII 0-9.

Commands echo the bytes they understood, so a decimal unit never passes unnoticed.
"""

from __future__ import annotations

import re
from fractions import Fraction

from gpuslice.errors import InvalidSize

__all__ = ["SIZE_PATTERN", "GiB", "KiB", "MiB", "TiB", "format_size", "looks_like_size", "parse_size"]

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_UNITS: dict[str, int] = {
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
_SPACE = "[\\t-\\r ]"  # ASCII white space (re.ASCII's \\s), spelled so every regex dialect reads it


def _any_case(unit: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" for c in unit)


# The grammar of a size, as a regular expression without flags that JSON Schema (ECMA-262) and Python
# read alike: the API publishes it as the pattern of its size fields and parse_size matches with it.
# ASCII digits only: Python's \d also matches "٢٠", which int() would read as 20.
SIZE_PATTERN = (
    f"^{_SPACE}*([0-9]+(?:\\.[0-9]+)?){_SPACE}*"
    f"({'|'.join(_any_case(u) for u in sorted(_UNITS, key=len, reverse=True))}){_SPACE}*$"
)
_SIZE = re.compile(SIZE_PATTERN)
# Something meant as a size ("0", "-5GiB", "1.5.2GiB", "8Gb"), only to word the refusal.
_LOOSE = re.compile(r"^\s*([-+]?)([0-9][0-9.]*)\s*([a-zA-Z]*)\s*$", re.ASCII)
_HINT = "use a number and a unit, e.g. 8GiB, 8000MiB, 8G"
_MAX_DIGITS = 30  # a yottabyte in bytes has 25; more is a typo or an attack, never a size


def parse_size(text: str | int) -> int:
    """Bytes in ``text`` ("8GiB", "8000MiB", "8G", "1.5GiB", "4096B"), at least one; raises InvalidSize
    otherwise. An ``int`` is already bytes (an API body may send one) and only has to be positive."""
    if isinstance(text, bool):
        raise InvalidSize(f"invalid size {text!r}: {_HINT}")
    if isinstance(text, int):
        if text <= 0:
            raise InvalidSize(f"invalid size {text}: a size must be at least one byte")
        return text
    match = _SIZE.fullmatch(str(text))
    if match is None:
        raise InvalidSize(f"invalid size {text!r}: {_size_mistake(str(text))}")
    number, unit = match.groups()
    if len(number) > _MAX_DIGITS:  # int() refuses past 4,300 digits with a ValueError, slowly before that
        raise InvalidSize(f"invalid size {text[:_MAX_DIGITS]!r}…: {len(number):,} digits; {_HINT}")
    factor = _UNITS[unit.lower()]
    value = Fraction(number) * factor  # exact: a float would round "9007199254740993B"
    if value.denominator != 1:
        raise InvalidSize(f"invalid size {text!r}: not a whole number of bytes")
    if value == 0:
        raise InvalidSize(f"invalid size {text!r}: a size must be at least one byte")
    return int(value)


def looks_like_size(text: str) -> bool:
    """Whether ``text`` was meant as a size (a number, perhaps signed or malformed, then letters), so a
    refusal can say what is wrong with the size rather than with whatever else the input could be."""
    return _LOOSE.fullmatch(text) is not None


def _size_mistake(text: str) -> str:
    """What is wrong with ``text``, which the size grammar refused, and what to write instead."""
    loose = _LOOSE.fullmatch(text)
    if loose is None:
        return _HINT
    sign, number, unit = loose.groups()
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", number):
        return f"{number!r} is not a number; {_HINT}"
    if sign == "-" or not number.strip("0."):  # zero, however written
        return f"a size must be at least one byte; {_HINT}"
    if sign:
        return f"a size has no sign; {_HINT}"
    if not unit:
        return f"a bare number has no unit; write {number}GiB (or {number}B for bytes)"
    return f"unknown unit {unit!r}; {_HINT}"


def format_size(size_bytes: int) -> str:
    """The largest binary unit that keeps the number at or above 1: 8589934592 -> '8 GiB'."""
    for unit, factor in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(size_bytes) >= factor:
            value = size_bytes / factor
            text = f"{value:.1f}".removesuffix(".0")  # one decimal, kept only when it is not 0
            return f"{text} {unit}"
    return f"{size_bytes} B"
