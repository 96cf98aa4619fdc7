"""Kubernetes quantities, read by one rule in the webhook, the extender, the device plugin and DRA.

A quantity is what the API server stores (``2``, ``500m``, ``8Gi``, ``1e3``), parsed by the official
client's ``kubernetes.utils.parse_quantity``. What it counts depends on where it stands:

=============================================  =========================================================
``gpuslice.io/gpu``, ``/gpucores``, ``/mig-*``  a whole count (extended resources are integers): ``2``,
                                                ``1k``; a fraction (``500m``, ``0.5``) is refused
``gpuslice.io/gpumem``                          whole **MiB** (``8192``; the API server stores 10000
                                                as ``10k``, so decimal multipliers count). A binary
                                                suffix is refused with the conversion in the message:
                                                ``8Gi`` there would ask the kubelet for 8,589,934,592
                                                MiB, a pod that waits forever; so is more MiB than any
                                                GPU has (``8G``: bytes, surely)
DRA capacity ``memory``                         **bytes**, as upstream DRA writes it (``8Gi``); gpuslice
                                                rounds up to whole MiB
DRA capacity ``cores``                          a whole percent of one GPU
=============================================  =========================================================

Every refusal is an ``InvalidRequest`` naming the field, the value and what to write instead.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from gpuslice.errors import InvalidRequest
from gpuslice.units import MiB

__all__ = ["bytes_as_mib", "mib_count", "parse", "whole_count"]

# Kubernetes' binary suffixes (apimachinery resource.Quantity). On a MiB resource they are someone
# writing bytes ("8Gi" meaning 8 GiB). The decimal ones are not refused: the API server writes a plain
# 10000 back as "10k" (its canonical form), so "10k" may be what the user wrote as 10000.
_BINARY_SUFFIX = re.compile(r"(Ki|Mi|Gi|Ti|Pi|Ei)$")
# More MiB than any GPU has (1 TiB; the largest today have 141-288 GB): bytes written where MiB count.
MAX_GPU_MIB = 1 << 20
# A quantity's longest text the API server accepts is far below this; refusing early keeps a hostile
# "1" * 10**6 from costing a Decimal parse of a megabyte.
_MAX_CHARS = 64
_LIMIT = Decimal(2**63)  # what fits a Quantity's int64 value, as the API server keeps it


def parse(value: Any, name: str) -> Decimal:
    """``value`` as a Kubernetes quantity; InvalidRequest names ``name`` and shows the accepted forms."""
    from kubernetes.utils import parse_quantity

    if isinstance(value, bool) or not isinstance(value, (str, int)) or len(str(value)) > _MAX_CHARS:
        raise InvalidRequest(f"{name}: {_shown(value)} is not a Kubernetes quantity (e.g. 2, 500m, 8Gi)")
    try:
        amount = Decimal(parse_quantity(str(value).strip()))
    except (ValueError, TypeError, InvalidOperation):
        raise InvalidRequest(f"{name}: {value!r} is not a Kubernetes quantity (e.g. 2, 500m, 8Gi)") from None
    if not amount.is_finite() or abs(amount) >= _LIMIT:
        raise InvalidRequest(f"{name}: {value!r} is out of range (a quantity is below 2^63)")
    return amount


def whole_count(value: Any, name: str) -> int:
    """A non-negative whole count (an extended resource: GPUs, a percent, MIG instances)."""
    amount = parse(value, name)
    if amount < 0 or amount != amount.to_integral_value():
        raise InvalidRequest(
            f"{name}: {value!r} is not a whole non-negative number (extended resources count)"
        )
    return int(amount)


def mib_count(value: Any, name: str) -> int:
    """Whole MiB; a binary-suffixed quantity, or more MiB than any GPU has, is refused with what it
    would have meant and the number to write instead (the kubelet counts this resource in MiB)."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    binary = bool(text) and len(text) <= _MAX_CHARS and bool(_BINARY_SUFFIX.search(text))
    amount = parse(value, name) if binary else Decimal(whole_count(value, name))
    if binary or amount > MAX_GPU_MIB:
        as_bytes = max(_ceil_mib(amount), 1)  # what it is as bytes, in whole MiB
        said = f"not {text} of memory" if binary else "more than any GPU has"
        raise InvalidRequest(
            f"{name} counts MiB: {text!r} asks for {amount:,.0f} MiB, {said}; write a plain number of "
            f"MiB ({as_bytes:,} if {text} was bytes)"
        )
    return int(amount)


def bytes_as_mib(value: Any, name: str) -> int:
    """A positive memory quantity in bytes (DRA capacity), rounded up to whole MiB: a request of 1.5 MiB
    gets 2, never 1."""
    amount = parse(value, name)
    if amount <= 0:
        raise InvalidRequest(f"{name}: {value!r} must be positive (e.g. 10Gi)")
    return _ceil_mib(amount)


def _ceil_mib(amount: Decimal) -> int:
    return int((amount / MiB).to_integral_value(rounding=ROUND_CEILING))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_CHARS else f"{text[:_MAX_CHARS]}… ({len(text)} characters)"
