"""The DRA claims gpuslice's driver holds, for the cluster view: every ResourceClaim whose allocation names
``gpu.gpuslice.io`` devices, read from the API server at most every few seconds however often the view is
built (one list per refresh window, not one per page), and any failure to read them said in one line.

```text
ClaimReader(list_claims).rows()  -> ([{"claim", "node", "pool", "devices", "share"}, ...], error or "")
claim_row(claim)                 -> one row, None for a claim without gpuslice devices (or malformed)
```

A claim is anyone's object: only strings and numbers of the expected shape are taken from it; anything
else drops that claim from the list (never the list, never the view).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuslice.k8s.dra.slices import DRIVER

__all__ = ["CLAIMS_TTL_S", "ClaimReader", "claim_row"]

log = logging.getLogger(__name__)

CLAIMS_TTL_S = 5.0  # the view refreshes every 3 s: one list per window serves every open page


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def claim_row(claim: Any) -> dict[str, Any] | None:
    """The view's row of one ResourceClaim: ``claim`` (namespace/name), ``node`` and ``pool`` (gpuslice's
    pools are named by their node), ``devices`` (device, with ``#shareID`` for a share) and ``share``
    (what a share consumes); None when gpuslice's driver holds nothing of it or its fields are not
    what the API writes."""
    if not isinstance(claim, Mapping):
        return None
    meta = claim.get("metadata")
    status = claim.get("status")
    if not isinstance(meta, Mapping) or not isinstance(status, Mapping):
        return None
    namespace, name = _text(meta.get("namespace")), _text(meta.get("name"))
    allocation = status.get("allocation")
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if namespace is None or name is None or not isinstance(results, list):
        return None
    ours = [r for r in results if isinstance(r, Mapping) and r.get("driver") == DRIVER]
    pools = sorted({p for r in ours if (p := _text(r.get("pool")))})
    names = [_text(r.get("device")) for r in ours]
    if not ours or not pools or None in names:
        return None
    shown = [
        f"{d}#{s[:8]}" if (s := _text(r.get("shareID"))) else str(d) for r, d in zip(ours, names, strict=True)
    ]
    shares = []
    for r in ours:
        consumed = r.get("consumedCapacity")
        if isinstance(consumed, Mapping):
            parts = [
                f"{k} {v}"
                for k, v in sorted(consumed.items())
                if isinstance(k, str) and isinstance(v, str | int)
            ]
            shares.append(", ".join(parts))
    return {
        "claim": f"{namespace}/{name}",
        "node": pools[0] if len(pools) == 1 else None,
        "pool": ", ".join(pools),
        "devices": shown,
        "share": "; ".join(s for s in shares if s),
    }


class ClaimReader:
    """Rows of gpuslice's allocated claims from ``list_claims`` (the API's list; None: this extender's API
    cannot list them, and the view says nothing), kept ``ttl_s`` seconds. Thread-safe: the view is built
    on a worker thread."""

    def __init__(
        self,
        list_claims: Callable[[], list[Any]] | None,
        ttl_s: float = CLAIMS_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._list = list_claims
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._rows: list[dict[str, Any]] = []
        self._error = ""

    def rows(self) -> tuple[list[dict[str, Any]], str]:
        """(rows sorted by claim, one line saying why they could not be read, or "")."""
        if self._list is None:
            return [], ""
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._ttl_s:
                self._read_at = now
                try:
                    found = self._list()
                except Exception as err:  # a 403 (no RBAC for claims), no DRA API, the API away
                    self._rows, self._error = [], f"cannot list ResourceClaims: {_one_line(err)}"
                    log.warning("cluster view: %s", self._error)
                else:
                    rows = [row for claim in found if (row := claim_row(claim)) is not None]
                    self._rows, self._error = sorted(rows, key=lambda r: r["claim"]), ""
            return list(self._rows), self._error


def _one_line(err: Exception) -> str:
    """The failure in one line: an API refusal is already worded by ``kube_client.api_errors`` (status,
    reason and the Status message); anything else (the API away) is cut to its first 200 characters."""
    return " ".join(str(err).split())[:200] or type(err).__name__
