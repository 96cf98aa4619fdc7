"""Kubernetes quantities, read by one rule in the webhook, the extender, the device plugin and DRA.

A quantity is what the API server stores (``2``, ``500m``, ``8Gi``, ``1e3``), parsed by the official
client's ``kubernetes.utils.parse_quantity``. What it counts depends on where it stands:

=============================================  =========================================================
``gpuslice.io/gpu``, ``/gpucores``, ``/mig-*``  a whole count (extended resources are integers): ``2``,
                                                ``1k``; a fraction (``500m``, ``0.5``) is refused
``gpuslice.io/gpumem``                          whole **MiB**, written as a plain number (``8192``). A
                                                byte suffix is refused with the conversion in the
                                                message: ``8Gi`` there would ask the kubelet for
                                                8,589,934,592 MiB, a pod that waits forever
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

# Kubernetes' suffixes that scale up (apimachinery resource.Quantity): binary, then decimal SI. On a MiB
# resource they are someone writing bytes ("8Gi" meaning 8 GiB); "m", "u" and "n" make a fraction.
_BYTE_SUFFIX = re.compile(r"(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)$")
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
    """Whole MiB written as a plain number; a suffixed quantity is refused with what it would have meant
    and the number to write instead (the kubelet counts this resource in MiB, not bytes)."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if text and len(text) <= _MAX_CHARS and _BYTE_SUFFIX.search(text):
        amount = parse(value, name)
        meant = max(_ceil_mib(amount), 1)  # what it is as bytes, in whole MiB
        raise InvalidRequest(
            f"{name} counts MiB: {text!r} asks for {amount:,.0f} MiB, not {text} of memory; "
            f"write a plain number of MiB ({meant:,.0f} for {text})"
        )
    return whole_count(value, name)


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
