"""How serve's node scheduler asks the shared placer for a job's GPUs (``scheduler.node_gpu_choice``):
the GPUs a job may not use stay masked, a job without GPUs gets none, and the placement policy is built
once per target workload with the view, a seeded generator and the machine's wiring."""

from __future__ import annotations

import numpy as np

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.topology_profiles import profile
from gpuslice.ledger import Ledger
from gpuslice.policies import placement_policy
from gpuslice.scheduler.node_fit import demand_for
from gpuslice.scheduler.node_gpu_choice import NodeGpuChoice
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload


class Recorded:
    """A placement factory (best fit) that keeps each view and context it was built with."""

    def __init__(self) -> None:
        self.built: list[tuple[object, object]] = []

    def __call__(self, view, context):
        self.built.append((view, context))
        return placement_policy("bestfit")(view, context)


def gpus(n: int, mig_first: bool = False) -> Machine:
    return Machine(
        "test",
        tuple(
            GpuInfo(i, f"GPU-{i}", "H100", 80 * GiB, mig_enabled=mig_first and i == 0, mig_model="h100-80gb")
            for i in range(n)
        ),
        profile("dgx-h100") if n == 8 else None,
    )


def shapes(target: TargetWorkload | None) -> tuple[object, ...] | None:
    return None if target is None else (target.shapes, target.probability.tolist())


def choice_on(machine: Machine, factory=None, target=None) -> NodeGpuChoice:
    ledger = Ledger([machine.node_spec()])
    return NodeGpuChoice(ledger, machine.topology, factory or Recorded(), target)


def test_a_job_without_gpus_gets_none_and_holds_its_own_request():
    machine = gpus(2)
    demand = demand_for(JobSpec(("run",), gpus=0), machine)
    chosen = choice_on(machine).choose(demand, frozenset())
    assert chosen is not None and chosen.gpus == () and chosen.holding.gpus == ()
    assert chosen.holding.request is demand.request


def test_a_gpu_the_job_may_not_use_is_never_chosen_even_where_best_fit_would_take_it():
    machine = gpus(2, mig_first=True)  # GPU 0 is in MIG mode: the demand may use GPU 1 only
    demand = demand_for(JobSpec(("run",), gpu_memory_bytes=10 * GiB), machine)
    assert demand.eligible == (1,)
    chosen = choice_on(machine).choose(demand, frozenset())
    assert chosen is not None and chosen.gpus == (1,)
    assert (chosen.holding.gpus, chosen.holding.milli, chosen.holding.memory_bytes) == ((1,), 1, 10 * GiB)


def test_the_policy_is_built_on_the_view_with_a_generator_seeded_0_and_the_machines_wiring():
    machine = gpus(8)
    factory = Recorded()
    choice = choice_on(machine, factory)
    placer = choice.placer()
    assert placer.topologies == [machine.topology]
    ((view, context),) = factory.built
    assert view is choice.ledger.view
    assert context.target is None  # no known jobs, no target given
    assert (
        context.rng.integers(1 << 30, size=4).tolist()
        == np.random.default_rng(0).integers(1 << 30, size=4).tolist()
    )


def test_the_default_target_is_the_known_jobs_shapes_and_the_policy_is_rebuilt_only_when_they_change():
    machine = gpus(2)
    factory = Recorded()
    choice = choice_on(machine, factory)
    small, big = Request(0, num_gpu=1, gpu_milli=250), Request(0, num_gpu=1, gpu_milli=500)
    known = frozenset({small, big})
    first = choice.placer(known)
    assert shapes(factory.built[-1][1].target) == shapes(TargetWorkload.from_requests(sorted(known, key=str)))
    assert choice.placer(known) is first and choice.placer(frozenset({big, small})) is first
    demand = demand_for(JobSpec(("run",), gpu_memory_bytes=10 * GiB), machine)
    assert choice.choose(demand, known) is not None and choice.placer(known) is first
    changed = choice.placer(frozenset({small}))
    assert changed is not first and len(factory.built) == 2
    assert shapes(factory.built[-1][1].target) == shapes(TargetWorkload.from_requests([small]))


def test_a_given_target_is_used_whatever_jobs_are_known():
    machine = gpus(2)
    factory = Recorded()
    target = TargetWorkload.from_requests([Request(0, num_gpu=1, gpu_milli=1000)])
    choice = choice_on(machine, factory, target)
    first = choice.placer(frozenset({Request(0, num_gpu=1, gpu_milli=250)}))
    assert choice.placer(frozenset({Request(0, num_gpu=1, gpu_milli=500)})) is first
    assert len(factory.built) == 1 and factory.built[0][1].target is target
