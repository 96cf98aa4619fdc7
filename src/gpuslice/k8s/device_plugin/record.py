"""The device plugin's own record of the slices it gave: which pod (by UID), which GPUs, what limits.

The node's metrics (``observe.node_slices``) label a pod's usage with the GPUs of this record, never
with what the pod's region or the pod's annotations say (the pod can rewrite both). Allocate adds an
entry once the pod is marked allocated; the entry is read back from the environment the container got
(``container_slice.slice_holder``), so it is exactly what the container was given.

```text
<state_dir>/device-plugin-allocations.json   0600, replaced atomically; {"version": 1, "slices": [...]}
held(live)   the entries whose pod UID is in ``live`` (the pods on the node that have not ended);
             an entry absent from ``live`` for PRUNE_AFTER_S is dropped (a list may lag a bind by a moment)
```

The state folder is the plugin's hostPath; no pod mounts this file. An entry that does not parse (a hand
edit, another version) is dropped with a log line, never a failed start. A pod allocated by a plugin
without this record (before an upgrade) has no per-pod series until it is created again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuslice.observe.node_slices import SliceHolder

__all__ = ["ALLOCATION_RECORD", "PRUNE_AFTER_S", "AllocationRecord"]

log = logging.getLogger(__name__)

ALLOCATION_RECORD = "device-plugin-allocations.json"
# A pod is bound before its Allocate, so a list taken after Allocate has it; the grace covers a list
# served from a lagging cache (resourceVersion "0": the API server's watch cache, usually milliseconds).
PRUNE_AFTER_S = 120.0


@dataclass(frozen=True, slots=True)
class _Entry:
    uid: str
    holder: SliceHolder
    given_unix_s: float

    def to_json(self) -> dict[str, Any]:
        h = self.holder
        return {
            "uid": self.uid, "given_unix_s": self.given_unix_s, "namespace": h.namespace, "pod": h.pod,
            "container": h.container, "gpus": list(h.gpus), "memory_bytes": h.memory_bytes,
            "compute_ratio": h.compute_ratio, "region": None if h.region is None else str(h.region),
            "inside": h.inside,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Any) -> _Entry:
        region = data["region"]
        holder = SliceHolder(
            namespace=str(data["namespace"]),
            gpus=tuple(int(g) for g in data["gpus"]),
            memory_bytes=int(data["memory_bytes"]),
            compute_ratio=float(data["compute_ratio"]),
            region=None if region is None else Path(str(region)),
            pod=str(data["pod"]),
            container=str(data["container"]),
            inside=bool(data["inside"]),
        )
        return cls(str(data["uid"]), holder, float(data["given_unix_s"]))


class AllocationRecord:
    """The slices given, kept in ``path``; thread-safe (Allocate and the metrics server both use it)."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], _Entry] = self._load()  # (pod uid, container) -> entry

    def _load(self) -> dict[tuple[str, str], _Entry]:
        try:
            data = json.loads(self.path.read_text())
            slices = data["slices"] if isinstance(data, dict) else None
            if not isinstance(slices, list):
                raise ValueError("no list of slices")
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError) as err:
            log.error("allocation record %s unreadable (%s); starting with none", self.path, err)
            return {}
        entries = {}
        for item in slices:
            try:
                entry = _Entry.from_json(item)
            except (KeyError, TypeError, ValueError) as err:
                log.error("allocation record %s: an entry dropped (%s)", self.path, err)
                continue
            entries[(entry.uid, entry.holder.container)] = entry
        return entries

    def add(self, uid: str, holder: SliceHolder) -> None:
        """Record that pod ``uid`` holds ``holder``. A file that cannot be written costs the metrics of a
        plugin restart, never the pod: it is logged, and the entry kept in memory."""
        with self._lock:
            self._entries[(uid, holder.container)] = _Entry(uid, holder, self._clock())
            self._save()

    def held(self, live_uids: Collection[str] | None) -> list[SliceHolder]:
        """The slices of the pods in ``live_uids``; every entry when None (the pods could not be listed)."""
        with self._lock:
            if live_uids is None:
                return [e.holder for e in self._entries.values()]
            now = self._clock()
            gone = [
                key
                for key, e in self._entries.items()
                if e.uid not in live_uids and now - e.given_unix_s > PRUNE_AFTER_S
            ]
            for key in gone:
                del self._entries[key]
            if gone:
                self._save()
            return [e.holder for e in self._entries.values() if e.uid in live_uids]

    def _save(self) -> None:
        text = json.dumps({"version": 1, "slices": [e.to_json() for e in self._entries.values()]})
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(tmp, self.path)
        except OSError as err:
            log.error("allocation record %s not written (%s); kept in memory only", self.path, err)
            with contextlib.suppress(OSError):
                tmp.unlink()
