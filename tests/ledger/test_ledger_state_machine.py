"""ledger.ledger under random sequences of reserve and release (hypothesis stateful testing).

Most random reservations are refused, which is the point: a refusal must leave the ledger as it was,
and no sequence may over-commit a GPU, lose a placement, or let one be released twice. One GPU is in MIG
mode: random MIG instances (any profile, any start, with or without columns) go there too, and no two
held instances may ever overlap.
"""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpuslice.errors import LedgerError
from gpuslice.hardware.mig import MigInstance, mig_gpu
from gpuslice.hardware.node import MAX_GPUS_PER_NODE, NodeSpec
from gpuslice.ledger.ledger import Ledger
from gpuslice.ledger.mig import mig_request
from gpuslice.ledger.placement import Placement, Refusal
from gpuslice.policies.base import best_fit_gpus
from gpuslice.units import GiB
from gpuslice.workload.request import Request

NODES = [
    NodeSpec("v100-a", 8_000, 16 * GiB, 4, "V100M16"),
    NodeSpec("t4-b", 4_000, 8 * GiB, 2, "T4"),
    NodeSpec("cpu-c", 4_000, 8 * GiB, 0, ""),
    NodeSpec("a100-d", 4_000, 8 * GiB, 2, "A100-80GB", gpu_memory_bytes=80 * GiB),
]
A100 = mig_gpu("A100-80GB")
MIG = {(3, 1): A100}  # GPU 1 of a100-d is in MIG mode
ARRAYS = ("free_cpu_milli", "free_memory_bytes", "free_gpu_milli", "gpu_tasks", "version")


@st.composite
def requests(draw: st.DrawFn) -> Request:
    cpu = draw(st.sampled_from([0, 500, 1_000, 3_000, 9_000]))
    memory = draw(st.sampled_from([0, GiB, 4 * GiB, 20 * GiB]))
    models = draw(st.sampled_from([(), ("T4",), ("V100M16",), ("A10",), ("T4", "V100M16")]))
    kind = draw(st.sampled_from(["cpu", "share", "whole"]))
    if kind == "cpu":
        return Request(cpu_milli=cpu, memory_bytes=memory)
    if kind == "share":
        milli = draw(st.sampled_from([1, 100, 250, 500, 700, 999]))
        return Request(cpu_milli=cpu, memory_bytes=memory, num_gpu=1, gpu_milli=milli, gpu_models=models)
    n = draw(st.integers(1, 5))
    return Request(cpu_milli=cpu, memory_bytes=memory, num_gpu=n, gpu_milli=1000, gpu_models=models)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(NODES, mig=MIG)
        self.live: dict[int, Placement] = {}
        self.released: list[Placement] = []

    def _state(self) -> tuple[object, ...]:
        arrays = tuple(getattr(self.ledger.view, name).copy() for name in ARRAYS)
        layouts = tuple(self.ledger.mig_layout(n, g) for n, g in MIG)
        return (*arrays, self.ledger.allocated_gpu_milli, self.ledger.live_placements, layouts)

    def _assert_unchanged(self, before: tuple[object, ...]) -> None:
        after = self._state()
        for old, new in zip(before, after, strict=True):
            if isinstance(old, np.ndarray):
                np.testing.assert_array_equal(old, new)
            else:
                assert old == new

    @rule(
        node=st.integers(-1, len(NODES)),
        gpus=st.lists(st.integers(-1, MAX_GPUS_PER_NODE), max_size=5),
        req=requests(),
    )
    def reserve_anywhere(self, node: int, gpus: list[int], req: Request) -> None:
        before = self._state()
        expected = self.ledger.check(node, gpus, req)
        result = self.ledger.reserve(node, gpus, req)
        if isinstance(result, Refusal):
            assert result == expected
            self._assert_unchanged(before)
        else:
            assert expected is None
            self.live[result.id] = result

    @rule(req=requests(), data=st.data())
    def reserve_with_the_right_gpu_count(self, req: Request, data: st.DataObject) -> None:
        """Random GPUs, but as many as asked for: reaches the per-GPU checks (duplicates, range, room)."""
        node = data.draw(st.integers(0, len(NODES) - 1))
        size = req.num_gpu
        gpus = data.draw(st.lists(st.integers(-1, MAX_GPUS_PER_NODE), min_size=size, max_size=size))
        self.reserve_anywhere(node, gpus, req)

    @rule(
        node=st.sampled_from([3, 3, 3, 0, -1, len(NODES)]),  # mostly the node with the MIG GPU
        gpu=st.sampled_from([1, 1, 1, 0, -1, 2]),
        profile=st.sampled_from(A100.profiles),
        start=st.integers(0, 7),
        columns=st.booleans(),
    )
    def reserve_mig_anywhere(self, node: int, gpu: int, profile: object, start: int, columns: bool) -> None:
        instance = MigInstance(profile, start)  # type: ignore[arg-type]
        req = mig_request(instance.profile, 80 * GiB) if columns else Request(cpu_milli=0)
        before = self._state()
        expected = self.ledger.check_mig(node, gpu, instance, req)
        result = self.ledger.reserve_mig(node, gpu, instance, req)
        if isinstance(result, Refusal):
            assert result == expected
            self._assert_unchanged(before)
        else:
            assert expected is None and result.mig is not None
            self.live[result.id] = result

    @invariant()
    def held_mig_instances_never_overlap(self) -> None:
        held = [p.mig.instance for p in self.live.values() if p.mig is not None]
        mask = 0
        for instance in held:
            assert not mask & instance.mask, f"MIG instances overlap: {[str(i) for i in held]}"
            mask |= instance.mask
        layout = self.ledger.mig_layout(3, 1)
        assert layout is not None and layout.mask == mask

    @rule(req=requests(), pick=st.integers(0, 10))
    def reserve_where_it_fits(self, req: Request, pick: int) -> None:
        fitting = np.flatnonzero(self.ledger.fits(req))
        if len(fitting) == 0:
            return
        node = int(fitting[pick % len(fitting)])
        result = self.ledger.reserve(node, best_fit_gpus(self.ledger.view, req, node), req)
        assert isinstance(result, Placement), f"fits() said node {node} fits but reserve refused: {result}"
        self.live[result.id] = result

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100))
    def release_live(self, pick: int) -> None:
        placement = list(self.live.values())[pick % len(self.live)]
        self.ledger.release(placement)
        del self.live[placement.id]
        self.released.append(placement)

    @precondition(lambda self: self.released)
    @rule(pick=st.integers(0, 100))
    def release_again(self, pick: int) -> None:
        placement = self.released[pick % len(self.released)]
        before = self._state()
        try:
            self.ledger.release(placement)
        except LedgerError:
            pass
        else:
            raise AssertionError(f"placement {placement.id} was released twice without an error")
        self._assert_unchanged(before)

    @invariant()
    def ledger_invariants_hold(self) -> None:
        self.ledger.check_invariants()

    @invariant()
    def free_values_stay_within_capacity(self) -> None:
        view = self.ledger.view
        assert ((view.free_cpu_milli >= 0) & (view.free_cpu_milli <= view.cpu_capacity_milli)).all()
        assert ((view.free_memory_bytes >= 0) & (view.free_memory_bytes <= view.memory_capacity_bytes)).all()
        assert ((view.free_gpu_milli >= 0) & (view.free_gpu_milli <= view.gpu_capacity_milli)).all()
        assert (view.gpu_tasks >= 0).all()

    @invariant()
    def allocated_equals_the_live_placements(self) -> None:
        assert self.ledger.allocated_gpu_milli == sum(p.request.total_gpu_milli for p in self.live.values())
        assert set(self.ledger.live_placements) == set(self.live.values())


LedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_no_sequence_of_reserve_and_release_overcommits_or_double_releases = LedgerMachine.TestCase
