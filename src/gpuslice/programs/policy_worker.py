"""The worker process side of an isolated policy file: load it, run its hooks, answer in plain data.

Started by ``policy_process.PolicyProcess`` as ``python -m gpuslice.programs.policy_worker READ_FD
WRITE_FD``. Before the policy's code runs, the process bounds itself: its address space
(``RLIMIT_AS``: a hook that allocates gigabytes gets a MemoryError here, not the server's memory), no
file writes (``RLIMIT_FSIZE`` 0), no core files, and it dies with its parent (``PR_SET_PDEATHSIG``).
Time is bounded from outside: the parent kills this process when a call runs past its budget.

One worker serves one loaded file and any number of its instances (a placement policy is built once
per ledger: sim builds one, the extender one per ledger build). Protocol, one message each way per
request (``multiprocessing.connection`` framing):

```text
parent -> worker   pickle: ("start", source, path, class_name, memory_limit)             # once
                           ("new", iid, args, maps)         args: the family's constructor arguments;
                                                            a placement view arrives as its Ledger
                           ("call", iid, hook, args, maps | None, sync | None, forget)
                           ("batch", iid, hook, [args, ...], maps | None, sync | None, forget)
worker -> parent   JSON:   {"ok": ANSWER, "maps": {name: [[k, v], ...]} | null}
                           {"fault": "exception ValueError" | "memory" | "invalid", "detail": "..."}
```

``maps`` in a call: the parent's copy after an operator's write (the parent's copy is the truth).
``sync``: the placements the parent's ledger took (+1) and gave back (-1) since the last call, in
order (``Ledger.changes``); the instance's own ledger replays them (``LedgerMirror``), so the policy
reads the same state as in process. ``forget``: instances the parent dropped. A placement hook's
view argument arrives as None and is replaced by the instance's own view.

The parent trusts what it sends (pickle) but not what comes back: the policy runs here, so answers go
back as JSON of tagged plain values (``encode``), never pickle, whose loading could run code.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["LedgerMirror", "decode", "encode", "main"]

_MAX_DEPTH = 32


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-ready tagged data: tuples and lists stay apart (a sort key must be a tuple),
    arrays keep their dtype's kind, numpy scalars become Python numbers, anything else arrives as
    "unrepresentable" (which no hook check accepts)."""
    import numpy as np

    if depth > _MAX_DEPTH:
        return {"unrepresentable": "nested too deep"}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, tuple):
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return {"list": [encode(v, depth + 1) for v in value]}
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and value.ndim == 1:
        return {"ndarray": value.tolist(), "kind": value.dtype.kind}
    return {"unrepresentable": type(value).__name__}


UNREPRESENTABLE = object()  # what an answer no check accepts decodes to


def decode(value: Any) -> Any:
    """The parent's side of ``encode``."""
    import numpy as np

    if not isinstance(value, dict):
        return value
    if "tuple" in value:
        return tuple(decode(v) for v in value["tuple"])
    if "list" in value:
        return [decode(v) for v in value["list"]]
    if "ndarray" in value:
        dtype = {"b": bool, "i": np.int64, "u": np.uint64, "f": np.float64}.get(value.get("kind"), np.float64)
        return np.asarray(value["ndarray"], dtype=dtype)
    return UNREPRESENTABLE


class LedgerMirror:
    """A placement instance's own copy of the parent's ledger, kept equal by replaying, in order, the
    placements the parent took and gave back (``Ledger.reserve``/``reserve_mig``/``release``: the
    ledger's own rules, MIG layouts and caches included)."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger  # unpickled: its view is bound to it (``Ledger.__setstate__``)
        self.held = dict(ledger._live)  # the parent's placement id -> this ledger's placement

    def apply(self, changes: list[tuple[int, Any]]) -> None:
        for sign, p in changes:
            if sign < 0:
                self.ledger.release(self.held.pop(p.id))
                continue
            if p.mig is not None:
                mine = self.ledger.reserve_mig(p.node, p.mig.gpu, p.mig.instance, p.request)
            else:
                mine = self.ledger.reserve(p.node, p.gpus, p.request)
            if not hasattr(mine, "id"):  # a refusal: the copies parted, a bug on the parent's side
                raise RuntimeError(f"the ledger copy refused the parent's placement {p.id}: {mine}")
            self.held[p.id] = mine


def _bound_self(memory_limit: int) -> None:
    """Limits set before any policy code runs (see the module docstring)."""
    if memory_limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, no signal
    with contextlib.suppress(OSError, AttributeError):  # die with the parent, even inside a hook
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before the line above took effect
        sys.exit(0)


def _map_state(maps: dict[str, Any]) -> dict[str, list[list[Any]]]:
    return {name: [[k, v] for k, v in m.dump()] for name, m in maps.items()}


class _Instance:
    def __init__(self, policy: Any, maps: dict[str, Any], mirror: LedgerMirror | None) -> None:
        self.policy, self.maps, self.mirror = policy, maps, mirror


class _Worker:
    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.loaded: Any = None
        self.instances: dict[int, _Instance] = {}

    def start(self, source: str, path: str, class_name: str, memory_limit: int) -> dict[str, Any]:
        from gpuslice.programs.loader import load_source

        self.loaded = load_source(source, path)  # verified again here: this process trusts nothing it runs
        if self.loaded.ops_class.__name__ != class_name:
            return {"fault": "invalid", "detail": f"the file's ops class is {self.loaded.ops_class.__name__}"}
        _bound_self(memory_limit)
        return {"ok": None, "maps": None}

    def new(self, iid: int, args: tuple[Any, ...], maps: dict[str, Any]) -> dict[str, Any]:
        from gpuslice.ledger.ledger import Ledger
        from gpuslice.programs.maps import Map

        live = {}
        for name, (spec, pairs) in maps.items():
            live[name] = Map.from_spec(spec)
            live[name].load(pairs)
        mirror = LedgerMirror(args[0]) if args and isinstance(args[0], Ledger) else None
        if mirror is not None:
            args = (mirror.ledger.view, *args[1:])
        self.instances[iid] = _Instance(self.loaded.instantiate(*args, maps=live), live, mirror)
        return {"ok": None, "maps": None}

    def call(self, iid: int, hook: str, args: Any, maps: dict[str, Any] | None, sync: Any,
             forget: list[int], batch: bool) -> dict[str, Any]:  # fmt: skip
        for gone in forget:
            self.instances.pop(gone, None)
        instance = self.instances[iid]
        if maps is not None:  # the operator wrote a map since the last call: the parent's copy is the truth
            for name, pairs in maps.items():
                instance.maps[name].clear()
                instance.maps[name].load(pairs)
        if instance.mirror is not None:
            if sync is not None:
                instance.mirror.apply(sync)
            view = instance.mirror.ledger.view
            args = [(view, *a[1:]) for a in args] if batch else (view, *args[1:])
        before = _map_state(instance.maps)
        fn = getattr(instance.policy, hook)
        answer = [fn(*a) for a in args] if batch else fn(*args)
        after = _map_state(instance.maps)
        return {"ok": encode(answer), "maps": after if after != before else None}

    def handle(self, message: tuple[Any, ...]) -> dict[str, Any]:
        kind = message[0]
        if kind == "start":
            return self.start(*message[1:])
        if kind == "new":
            return self.new(*message[1:])
        return self.call(*message[1:], batch=kind == "batch")

    def serve(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return  # the parent closed the pipe or died
            try:
                reply = self.handle(message)
            except MemoryError:
                reply = {"fault": "memory", "detail": "the hook ran out of its address-space limit"}
            except RecursionError:
                reply = {"fault": "exception RecursionError", "detail": "recursion too deep"}
            except Exception as err:  # the policy's own error: the parent counts it, the default decides
                reply = {"fault": f"exception {type(err).__name__}", "detail": str(err)[:500]}
            try:
                data = json.dumps(reply, allow_nan=True).encode()
            except (ValueError, TypeError, MemoryError, RecursionError) as err:
                detail = f"the answer could not be sent: {type(err).__name__}"
                data = json.dumps({"fault": "invalid", "detail": detail}).encode()
            self.conn.send_bytes(data)


class _Duplex:
    """The worker's two pipe ends as one connection."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._in = Connection(read_fd, writable=False)
        self._out = Connection(write_fd, readable=False)

    def recv(self) -> Any:
        return self._in.recv()

    def send_bytes(self, data: bytes) -> None:
        self._out.send_bytes(data)


def main(argv: list[str]) -> int:
    _Worker(_Duplex(int(argv[0]), int(argv[1]))).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
