"""The ledger: free capacity of every node and GPU as numpy columns, changed only by reserve/release.

Columns (N nodes, G = MAX_GPUS_PER_NODE GPU slots per node; slots past a node's GPU count hold 0):

* ``free_cpu_milli`` (N,), ``free_memory_bytes`` (N,)
* ``free_gpu_milli`` (N, G): milli-GPU free on each GPU, 0..1000
* ``free_gpu_memory_bytes`` (N, G): GPU memory free on each GPU (capacity from the node's GPU model)
* ``gpu_tasks`` (N, G): how many placements hold a share of each GPU
* ``version`` (N,): bumped whenever a node's row changes, so score caches know what went stale
* MIG (``ledger.mig``): per GPU in MIG mode its geometry and the instances held there, read as a
  ``MigLayout`` (``mig_layout``); an instance is a placement taken by ``reserve_mig``

Invariants, checked by ``check_invariants`` and kept by construction: 0 <= free <= capacity for every
column, free GPU milli = capacity − the sum of the live placements' shares, and the live placements are
exactly those reserved and not yet released, and each MIG GPU's layout holds exactly the live
placements' instances there. ``reserve`` (and ``reserve_mig``) validates everything before it writes, so a
refusal (a value, not an exception) leaves every column as it was.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import count
from types import MappingProxyType
from typing import ClassVar

import numpy as np

from gpuslice.errors import LedgerError
from gpuslice.hardware.mig import MigGpu, MigInstance, MigLayout
from gpuslice.hardware.node import MAX_GPUS_PER_NODE, NodeSpec
from gpuslice.ledger.fit import CHECKS, FITS, Rows, code_number, code_of, fit_codes, refusal_at
from gpuslice.ledger.mig import MigHold, MigInstances
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode, Unit
from gpuslice.ledger.whatif import NodeRow
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = ["Ledger", "LedgerView"]


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class LedgerView:
    """Read-only window on a ledger for policies: the same memory, so it is always current.

    Policies read these arrays and may call ``fits``; they cannot write (numpy raises on assignment).
    """

    # Every numpy array the view exposes (tests check each is read-only and survives a refusal).
    ARRAYS: ClassVar[tuple[str, ...]] = (
        "node_model",
        "gpu_count",
        "cpu_capacity_milli",
        "memory_capacity_bytes",
        "gpu_capacity_milli",
        "gpu_memory_capacity_bytes",
        "free_cpu_milli",
        "free_memory_bytes",
        "free_gpu_milli",
        "free_gpu_memory_bytes",
        "gpu_tasks",
        "version",
    )

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.node_names = ledger.node_names
        self.models = ledger.models
        self.node_model = _read_only(ledger._node_model)
        self.gpu_count = _read_only(ledger._gpu_count)
        self.cpu_capacity_milli = _read_only(ledger._cpu_capacity)
        self.memory_capacity_bytes = _read_only(ledger._memory_capacity)
        self.gpu_capacity_milli = _read_only(ledger._gpu_capacity)
        self.gpu_memory_capacity_bytes = _read_only(ledger._gpu_memory_capacity)
        self.free_gpu_memory_bytes = _read_only(ledger._free_gpu_memory)
        self.free_cpu_milli = _read_only(ledger._free_cpu)
        self.free_memory_bytes = _read_only(ledger._free_memory)
        self.free_gpu_milli = _read_only(ledger._free_gpu)
        self.gpu_tasks = _read_only(ledger._gpu_tasks)
        self.version = _read_only(ledger._version)

    @property
    def node_count(self) -> int:
        return len(self.node_names)

    def fits(self, request: Request) -> np.ndarray:
        return self._ledger.fits(request)

    def model_allowed(self, request: Request) -> np.ndarray:
        return self._ledger.model_allowed(request)

    def gpu_fits(self, request: Request, node: int | slice | np.ndarray) -> np.ndarray:
        return self._ledger.gpu_fits(request, node)

    def mig_layout(self, node: int, gpu: int) -> MigLayout | None:
        return self._ledger.mig_layout(node, gpu)

    @property
    def mig_gpus(self) -> tuple[tuple[int, int], ...]:
        return self._ledger.mig_gpus

    def mig_gpus_on(self, node: int) -> tuple[int, ...]:
        return self._ledger.mig_gpus_on(node)


_CHECK_NUMBERS = tuple(code_number(c) for c in CHECKS)


class Ledger:
    """Free CPU, memory and per-GPU milli-GPU of a set of nodes; see the module docstring."""

    def __init__(
        self, nodes: Sequence[NodeSpec], mig: Mapping[tuple[int, int], MigGpu] | None = None
    ) -> None:
        """``mig``: the GPUs in MIG mode, (node, GPU) -> their MIG table."""
        if not nodes:
            raise ValueError("a ledger needs at least one node")
        n = len(nodes)
        self.node_names: tuple[str, ...] = tuple(node.name for node in nodes)
        self.models: tuple[str, ...] = tuple(sorted({node.gpu_model for node in nodes if node.gpu_count}))
        model_index = {m: i for i, m in enumerate(self.models)}
        no_gpu = len(self.models)  # CPU-only nodes point at an extra "model" no GPU request allows
        self._node_model = np.array(
            [model_index[node.gpu_model] if node.gpu_count else no_gpu for node in nodes], dtype=np.int64
        )
        self._gpu_count = np.array([node.gpu_count for node in nodes], dtype=np.int64)
        self._cpu_capacity = np.array([node.cpu_milli for node in nodes], dtype=np.int64)
        self._memory_capacity = np.array([node.memory_bytes for node in nodes], dtype=np.int64)
        slots = np.arange(MAX_GPUS_PER_NODE)
        present = slots[None, :] < self._gpu_count[:, None]
        self._gpu_capacity = np.where(present, MILLI_PER_GPU, 0).astype(np.int64)
        gpu_memory = np.array(
            [
                list(node.gpu_memory_each) + [0] * (MAX_GPUS_PER_NODE - node.gpu_count)
                if node.gpu_memory_each is not None
                else [node.gpu_memory_bytes] * MAX_GPUS_PER_NODE
                for node in nodes
            ],
            dtype=np.int64,
        )
        self._gpu_memory_capacity = np.where(present, gpu_memory, 0).astype(np.int64)
        self._free_cpu = self._cpu_capacity.copy()
        self._free_memory = self._memory_capacity.copy()
        self._free_gpu = self._gpu_capacity.copy()
        self._free_gpu_memory = self._gpu_memory_capacity.copy()
        self._gpu_tasks = np.zeros((n, MAX_GPUS_PER_NODE), dtype=np.int64)
        self._version = np.zeros(n, dtype=np.int64)
        for node, gpu in mig or {}:
            if not (0 <= node < n and 0 <= gpu < self._gpu_count[node]):
                raise ValueError(f"MIG mode given for GPU {gpu} of node {node}, which does not exist")
        self._mig = MigInstances(mig or {}, n)
        self.mig_gpus: tuple[tuple[int, int], ...] = tuple(sorted(self._mig.geometries))
        self._live: dict[int, Placement] = {}
        self._ids = count()
        self._model_masks: dict[tuple[tuple[str, ...], tuple[str, ...]], np.ndarray] = {}
        self.total_gpu_milli = int(self._gpu_capacity.sum())
        self.allocated_gpu_milli = 0
        self.view = LedgerView(self)
        # Placements taken (+1) and given back (-1), kept only while someone follows them (``follow``):
        # a policy in a worker process keeps a copy of this ledger equal by replaying them.
        self._journal: list[tuple[int, Placement]] = []
        self._journal_base = 0  # the position of _journal[0] since the ledger was built
        self._followers: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()

    def __getstate__(self) -> dict[str, object]:
        """A copy (pickle) has the ledger's state, not its followers; its view is bound again on load."""
        next_id = next(self._ids)  # itertools.count does not pickle on every Python: its next value does
        self._ids = count(next_id)
        state = dict(self.__dict__)
        state.update(_journal=[], _journal_base=0, _followers=None, view=None, _ids=next_id)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._ids = count(state["_ids"])  # type: ignore[call-overload]
        self._followers = weakref.WeakKeyDictionary()
        self.view = LedgerView(self)

    def follow(self, follower: object) -> None:
        """Record takes and gives from now on for ``follower`` (held weakly); ``changes`` reads them."""
        self._followers[follower] = self._journal_base + len(self._journal)

    def changes(self, follower: object) -> list[tuple[int, Placement]]:
        """The takes (+1) and gives (-1) since ``follower`` last asked, oldest first; entries every
        follower has read are dropped."""
        start = self._followers[follower] - self._journal_base
        entries = self._journal[start:]
        self._followers[follower] = self._journal_base + len(self._journal)
        oldest = min(self._followers.values()) - self._journal_base
        if oldest > 0:
            del self._journal[:oldest]
            self._journal_base += oldest
        return entries

    def _record(self, sign: int, placement: Placement) -> None:
        if self._followers:
            self._journal.append((sign, placement))

    # ---- queries -------------------------------------------------------------------------------------

    @property
    def node_count(self) -> int:
        return len(self.node_names)

    @property
    def live_placements(self) -> tuple[Placement, ...]:
        return tuple(self._live.values())

    def mig_layout(self, node: int, gpu: int) -> MigLayout | None:
        """The MIG instances held on that GPU; None if it is not in MIG mode."""
        return self._mig.layout(node, gpu)

    def row(self, node: int) -> NodeRow:
        """The node's free capacity as a value for what-ifs (``ledger.whatif``), its MIG GPUs' layouts
        included; later changes of the ledger do not show through."""
        layouts = MappingProxyType(self._mig.layouts_on(node))
        return NodeRow.of(self.row_columns(), node, int(self._gpu_count[node]), layouts)

    def row_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The columns a ``NodeRow`` is read from (``NodeRow.of``), in its order; the ledger's own
        arrays (read-only views), so a what-if that keeps a snapshot copies them."""
        return tuple(  # type: ignore[return-value]
            _read_only(a)
            for a in (
                self._free_cpu,
                self._free_memory,
                self._free_gpu,
                self._free_gpu_memory,
                self._gpu_memory_capacity,
            )
        )

    def model_allowed(self, request: Request) -> np.ndarray:
        """Bool per node: the node's GPU model is one the request accepts (CPU-only nodes: False)."""
        key = (request.gpu_models, request.excluded_gpu_models)
        mask = self._model_masks.get(key)
        if mask is None:
            per_model = np.array(
                [
                    (not request.gpu_models or m in request.gpu_models)
                    and m not in request.excluded_gpu_models
                    for m in self.models
                ]
                + [False]
            )
            mask = per_model[self._node_model]
            mask.flags.writeable = False
            self._model_masks[key] = mask
        return mask

    def gpu_fits(self, request: Request, node: int | slice | np.ndarray = slice(None)) -> np.ndarray:
        """Bool per GPU of ``node`` (or (N, G) for all nodes): room for one GPU's worth of the request."""
        ok = self._free_gpu[node] >= request.gpu_milli
        if request.gpu_memory_bytes:
            ok &= self._free_gpu_memory[node] >= request.gpu_memory_bytes
        return ok

    def mig_gpus_on(self, node: int) -> tuple[int, ...]:
        """The node's GPUs in MIG mode, lowest first (``mig_gpus`` is every node's)."""
        return self._mig.gpus_on(node)

    def mig_slots(self, profile: str) -> np.ndarray:
        """Bool per node (read-only, kept current): a MIG GPU of the node has a free start for
        ``profile`` now (the GPU's table has the profile, its slices are free, its per-GPU cap not
        reached)."""
        return self._mig.slots(profile)

    def fits(self, request: Request) -> np.ndarray:
        """Bool per node: the request could be reserved there now (one vector expression, no node loop;
        a MIG request's slot is read from each MIG GPU's layout)."""
        ok = (self._free_cpu >= request.cpu_milli) & (self._free_memory >= request.memory_bytes)
        if request.mig_profile:
            if request.gpu_models or request.excluded_gpu_models:
                ok &= self.model_allowed(request)
            return ok & self.mig_slots(request.mig_profile)
        if request.num_gpu:
            ok &= self.model_allowed(request)
            ok &= self.gpu_fits(request).sum(axis=1) >= request.num_gpu
        return ok

    def refusal_codes(
        self, request: Request, rows: slice | np.ndarray = slice(None), usable: np.ndarray | None = None
    ) -> np.ndarray:
        """Per node of ``rows``, the number of the first check the request fails (``ledger.fit``; 0 =
        fits). ``usable`` (rows, G): the GPUs the home lets the request use. ``fits`` is the fast form
        of ``refusal_codes(request) == 0``."""
        return fit_codes(
            request,
            self.model_allowed(request)[rows],
            usable,
            self._free_gpu[rows],
            self._free_gpu_memory[rows],
            self._free_cpu[rows],
            self._free_memory[rows],
            self.mig_slots(request.mig_profile)[rows] if request.mig_profile else None,
        )

    def why_not(self, request: Request, codes: np.ndarray | None = None) -> Counter[RefusalCode]:
        """For a request that fits nowhere: per node, the first reason it fails, counted over nodes
        (``codes``: the fit rule's per node, computed when not given)."""
        codes = self.refusal_codes(request) if codes is None else codes
        numbers = np.bincount(codes, minlength=len(RefusalCode) + 1)
        return Counter(
            {code: int(numbers[code_number(code)]) for code in CHECKS if numbers[code_number(code)]}
        )

    def refusal(self, node: int, request: Request, usable: np.ndarray | None = None) -> Refusal | None:
        """Why ``node`` cannot take ``request`` now, with the amounts (``ledger.fit.shortfall``), or None
        if it can: the fit rule's first failing check on that node. ``usable`` (G,): the GPUs the home
        lets the request use."""
        rows = np.array([node])
        code = code_of(int(self.refusal_codes(request, rows, None if usable is None else usable[None])[0]))
        return None if code is None else self._refusal(code, request, rows, usable)

    def closest(
        self,
        request: Request,
        codes: np.ndarray | None = None,
        rows: np.ndarray | None = None,
        usable: np.ndarray | None = None,
    ) -> Refusal | None:
        """For a request that fits on none of ``rows`` (default: every node), the node it came closest on,
        with its amounts: among the nodes that fail the most common check of the fit rule, the one with
        the most of that resource free (the first such node on a tie; between checks, the earlier).
        ``codes``: the verdict per row, computed when not given (a home's own codes beside the rule's
        are ignored); ``usable`` (rows, G): the GPUs the home lets it use. None when it fits on one."""
        rows = np.arange(self.node_count) if rows is None else np.asarray(rows)
        codes = self.refusal_codes(request, rows, usable) if codes is None else np.asarray(codes)
        counts = np.bincount(codes, minlength=len(RefusalCode) + 1)
        number = max(_CHECK_NUMBERS, key=lambda k: counts[k])  # ties: the earliest check of the rule
        if counts[FITS] or not counts[number]:
            return None
        code = code_of(number)
        assert code is not None
        use = None if usable is None else usable[codes == number]
        return self._refusal(code, request, rows[codes == number], use)

    def _refusal(
        self,
        code: RefusalCode,
        request: Request,
        rows: np.ndarray,
        usable: np.ndarray | None = None,
    ) -> Refusal:
        """``fit.refusal_at`` on the ledger's ``rows``: of the row with the most free (on one row, that
        row)."""
        return refusal_at(code, request, self._rows(rows, usable), rows)

    def _rows(self, rows: np.ndarray, usable: np.ndarray | None = None) -> Rows:
        """``ledger.fit.Rows`` of ``rows``; the usable GPUs are those present (and in ``usable``, (R, G))."""
        present = np.arange(MAX_GPUS_PER_NODE)[None, :] < self._gpu_count[rows, None]
        return Rows(
            self._free_gpu[rows],
            self._free_gpu_memory[rows],
            self._gpu_memory_capacity[rows],
            present if usable is None else present & np.asarray(usable, dtype=bool),
            self._free_cpu[rows],
            self._cpu_capacity[rows],
            self._free_memory[rows],
            self._memory_capacity[rows],
        )

    # ---- changes -------------------------------------------------------------------------------------

    def check(self, node: int, gpus: Sequence[int], request: Request) -> Refusal | None:
        """The refusal ``reserve`` would return, or None if it would succeed. Reads only. The GPU checks
        run in the fit rule's order (``ledger.fit``: model, memory, compute). A MIG request is refused:
        it is held with its instance (``reserve_mig``), never as columns alone."""
        if request.mig_profile:
            return Refusal(RefusalCode.NO_MIG_SLOT, node)
        return self._check_columns(node, gpus, request)

    def _check_columns(self, node: int, gpus: Sequence[int], request: Request) -> Refusal | None:
        """The caller's own mistakes first (no such node, the wrong GPU count, a GPU twice; a GPU the node
        lacks once its model is allowed), then the fit rule's checks in its order (``ledger.fit.CHECKS``:
        model, GPU memory, GPU, CPU, memory), so that ``reserve`` and ``refusal_codes`` name the same
        first reason."""
        if not 0 <= node < self.node_count:
            return Refusal(RefusalCode.NO_SUCH_NODE, node)
        if len(gpus) != request.num_gpu:
            return Refusal(RefusalCode.WRONG_GPU_COUNT, node, need=request.num_gpu, free=len(gpus))
        if len(set(gpus)) != len(gpus):
            return Refusal(RefusalCode.DUPLICATE_GPU, node)
        if request.num_gpu and not self.model_allowed(request)[node]:
            return Refusal(RefusalCode.GPU_MODEL_NOT_ALLOWED, node)  # also a node with no GPUs at all
        for gpu in gpus:
            if not 0 <= gpu < self._gpu_count[node]:
                return Refusal(RefusalCode.NO_SUCH_GPU, node, gpu=gpu)
        for gpu in gpus:
            if self._free_gpu_memory[node, gpu] < request.gpu_memory_bytes:
                return Refusal(
                    RefusalCode.INSUFFICIENT_GPU_MEMORY,
                    node,
                    gpu=gpu,
                    need=request.gpu_memory_bytes,
                    free=int(self._free_gpu_memory[node, gpu]),
                    capacity=int(self._gpu_memory_capacity[node, gpu]),
                    unit=Unit.GPU_MEMORY,
                )
        for gpu in gpus:
            if self._free_gpu[node, gpu] < request.gpu_milli:
                return Refusal(
                    RefusalCode.INSUFFICIENT_GPU,
                    node,
                    gpu=gpu,
                    need=request.gpu_milli,
                    free=int(self._free_gpu[node, gpu]),
                    capacity=MILLI_PER_GPU,
                    unit=Unit.GPU_MILLI,
                )
        if self._free_cpu[node] < request.cpu_milli:  # the amounts only for a refusal: reserve is hot
            return self._refusal(RefusalCode.INSUFFICIENT_CPU, request, np.array([node]))
        if self._free_memory[node] < request.memory_bytes:
            return self._refusal(RefusalCode.INSUFFICIENT_MEMORY, request, np.array([node]))
        return None

    def reserve(self, node: int, gpus: Sequence[int], request: Request) -> Placement | Refusal:
        """Take ``request`` on ``node`` and ``gpus``; a Refusal (ledger unchanged) if it does not fit."""
        gpus = tuple(int(g) for g in gpus)
        refusal = self.check(node, gpus, request)
        if refusal is not None:
            return refusal
        self._apply(node, gpus, request, sign=-1)
        placement = Placement(node=node, gpus=gpus, request=request, id=next(self._ids))
        self._live[placement.id] = placement
        self._record(+1, placement)
        return placement

    def hold_whole(self, node: int, gpu: int) -> Placement | Refusal:
        """Take all of one GPU's compute and memory, so that no request sees it free: how a home sets
        aside a GPU in MIG mode (its instances are held apart, ``reserve_mig``) or one it cannot use."""
        if not 0 <= node < self.node_count:
            return Refusal(RefusalCode.NO_SUCH_NODE, node)
        whole = Request(
            0,
            num_gpu=1,
            gpu_milli=MILLI_PER_GPU,
            gpu_memory_bytes=int(self._gpu_memory_capacity[node, gpu]) if 0 <= gpu < MAX_GPUS_PER_NODE else 0,
        )
        return self.reserve(node, (gpu,), whole)

    def check_mig(self, node: int, gpu: int, instance: MigInstance, request: Request) -> Refusal | None:
        """The refusal ``reserve_mig`` would return, or None. Reads only. The MIG check first
        (``ledger.mig``), then ``request`` on ``(gpu,)`` (or on no GPU when it asks for none)."""
        if not 0 <= node < self.node_count:
            return Refusal(RefusalCode.NO_SUCH_NODE, node)
        if request.mig_profile not in ("", instance.profile.name):  # a request for another profile
            return Refusal(RefusalCode.NO_MIG_SLOT, node, gpu=gpu)
        if (request.gpu_models or request.excluded_gpu_models) and not self.model_allowed(request)[node]:
            return Refusal(RefusalCode.GPU_MODEL_NOT_ALLOWED, node)  # the fit rule's first check
        refusal = self._mig.check(node, MigHold(gpu, instance))
        return refusal or self._check_columns(node, (gpu,) if request.num_gpu else (), request)

    def reserve_mig(
        self, node: int, gpu: int, instance: MigInstance, request: Request
    ) -> Placement | Refusal:
        """Hold the MIG ``instance`` on ``gpu`` of ``node``, taking ``request``'s columns there (see
        ``ledger.mig``); a Refusal, and the ledger unchanged, if the instance or the request does not fit."""
        node, gpu = int(node), int(gpu)
        refusal = self.check_mig(node, gpu, instance, request)
        if refusal is not None:
            return refusal
        hold = MigHold(gpu, instance)
        gpus = (gpu,) if request.num_gpu else ()
        self._apply(node, gpus, request, sign=-1)
        self._mig.take(node, hold)
        placement = Placement(node=node, gpus=gpus, request=request, id=next(self._ids), mig=hold)
        self._live[placement.id] = placement
        self._record(+1, placement)
        return placement

    def release(self, placement: Placement) -> None:
        """Give back a live placement. Raises LedgerError (and changes nothing) if it is not live."""
        held = self._live.get(placement.id)
        if held is None or held != placement:
            state = "was never reserved" if placement.id < 0 else "is not held (released twice?)"
            raise LedgerError(f"cannot release placement {placement.id} on node {placement.node}: it {state}")
        del self._live[placement.id]
        self._apply(placement.node, placement.gpus, placement.request, sign=+1)
        if placement.mig is not None:
            self._mig.give(placement.node, placement.mig)
        self._record(-1, placement)

    def _apply(self, node: int, gpus: tuple[int, ...], request: Request, sign: int) -> None:
        self._free_cpu[node] += sign * request.cpu_milli
        self._free_memory[node] += sign * request.memory_bytes
        for gpu in gpus:
            self._free_gpu[node, gpu] += sign * request.gpu_milli
            self._free_gpu_memory[node, gpu] += sign * request.gpu_memory_bytes
            self._gpu_tasks[node, gpu] -= sign
        self.allocated_gpu_milli -= sign * request.total_gpu_milli
        self._version[node] += 1

    def check_invariants(self) -> None:
        """Raise LedgerError if any column disagrees with the live placements (tests call this)."""
        cpu = self._cpu_capacity.copy()
        memory = self._memory_capacity.copy()
        gpu = self._gpu_capacity.copy()
        gpu_memory = self._gpu_memory_capacity.copy()
        tasks = np.zeros_like(self._gpu_tasks)
        for p in self._live.values():
            cpu[p.node] -= p.request.cpu_milli
            memory[p.node] -= p.request.memory_bytes
            for g in p.gpus:
                gpu[p.node, g] -= p.request.gpu_milli
                gpu_memory[p.node, g] -= p.request.gpu_memory_bytes
                tasks[p.node, g] += 1
        problems = [
            name
            for name, ok in (
                ("free CPU", np.array_equal(cpu, self._free_cpu)),
                ("free memory", np.array_equal(memory, self._free_memory)),
                ("free GPU", np.array_equal(gpu, self._free_gpu)),
                ("free GPU memory", np.array_equal(gpu_memory, self._free_gpu_memory)),
                ("GPU memory in 0..capacity", bool((gpu_memory >= 0).all())),
                ("GPU task counts", np.array_equal(tasks, self._gpu_tasks)),
                ("non-negative", bool((self._free_cpu >= 0).all() and (self._free_memory >= 0).all())),
                ("GPU in 0..capacity", bool(((gpu >= 0) & (gpu <= self._gpu_capacity)).all())),
                ("allocated total", self.allocated_gpu_milli == int((self._gpu_capacity - gpu).sum())),
                ("MIG instances", self._mig.agrees_with(self._live.values())),
            )
            if not ok
        ]
        if problems:
            raise LedgerError(f"ledger invariant broken: {', '.join(problems)}")
