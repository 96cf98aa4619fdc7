"""One MIG choice in every home that places MIG requests: on the same MIG GPUs holding the same
instances, serve's node scheduler (which creates the instance), the Kubernetes extender (which picks
one of the instances the device plugin advertises, here every start of the profile) and sim (the
placer's MIG path over a ledger of the trace's nodes) give the same GPU and start, all through
``scheduler/mig_choice.py`` and the MIG placement policy; over several nodes, sim and the extender
deciding the node (``--decide``) take the same node too."""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_extender import FakeApi, inventory, make_state, pod_json

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.mig import MigInstance, mig_gpu
from gpuslice.hardware.node import NodeSpec
from gpuslice.k8s.annotations import (
    MigSlot,
)
from gpuslice.k8s.decision import Decision, MigChoice
from gpuslice.k8s.extender import WatchEvent
from gpuslice.ledger.placement import Placement
from gpuslice.policies import PolicyContext, placement_policy
from gpuslice.scheduler.mig_choice import choose_mig_instance, created_candidates
from gpuslice.scheduler.node_scheduler import MigAssignment, NodeScheduler, StartJob
from gpuslice.scheduler.placer import Placer
from gpuslice.sim.cluster_ledger import cluster_ledger
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec
from gpuslice.workload.request import Request

MODEL, GPUS = "A100-80GB", 3
GEOMETRY = mig_gpu(MODEL)


def held_instances(profile: str, seed: int) -> list[tuple[int, int]]:
    """(GPU, start) of the instances of ``profile`` held before the new request, at random."""
    rng = random.Random(seed)
    starts = GEOMETRY.profile(profile).starts
    every = [(g, s) for g in range(GPUS) for s in starts]
    return rng.sample(every, rng.randint(0, len(every) - 1))


def serve_choice(profile: str, held: list[tuple[int, int]]) -> tuple[int, int]:
    gpus = tuple(
        GpuInfo(i, f"GPU-{i}", MODEL, 80 * GiB, mig_enabled=True, mig_model="a100-80gb") for i in range(GPUS)
    )
    sched = NodeScheduler(Machine("m", gpus, None))
    for k, (g, start) in enumerate(held):
        spec = JobSpec(("run",), gpus=1, mig_profile=profile)
        sched.adopt(f"held-{k}", spec, (g,), 0.0, MigAssignment(g, profile, start))
    sched.submit("new", JobSpec(("run",), gpus=1, mig_profile=profile), 1.0)
    (start,) = [d for d in sched.step(1.0) if isinstance(d, StartJob)]
    assert start.mig is not None
    return start.mig.gpu, start.mig.start


def extender_choice(
    profile: str, held: list[tuple[int, int]], nodes: int = 1, decide: bool = False
) -> tuple[int, int, int]:
    """(node, GPU, start) the extender binds the new pod to; ``held`` as (node × GPUS + GPU, start)."""
    starts = GEOMETRY.profile(profile).starts
    slots = {g: tuple(MigSlot(profile, s, f"MIG-{g}-{s}") for s in starts) for g in range(GPUS)}
    names = [f"n{i}" for i in range(nodes)]
    state = make_state(FakeApi(), {n: inventory(MODEL, gpus=GPUS, mig=slots) for n in names})
    state.narrow = decide  # --decide: the extender takes the node itself, one passes
    resources = {f"gpuslice.io/mig-{profile}": "1"}
    for k, (flat, s) in enumerate(held):
        node, g = divmod(flat, GPUS)
        mig = MigChoice(g, profile, s, f"MIG-{g}-{s}")
        decision = Decision(names[node], "train", (g,), (f"GPU-{MODEL}-{g:02d}",), 0, 100, mig)
        pod = pod_json(f"held-{k}", resources, decision.to_annotations(), node=names[node])
        state.apply(WatchEvent("Pod", "ADDED", pod))
    passed = state.filter(pod_json("new", resources), names).passed
    assert len(passed) == 1 if decide else passed == names
    assert state.bind("team-a", "new", "uid-new", passed[0]) == ""
    decision = Decision.from_annotations(state.api.patches[-1][2])  # type: ignore[attr-defined]
    assert decision is not None and decision.mig is not None
    state.check_invariants()
    return names.index(decision.node), decision.mig.gpu_index, decision.mig.start


def sim_choice(profile: str, held: list[tuple[int, int]], nodes: int = 1) -> tuple[int, int, int]:
    """(node, GPU, start) sim's placer gives the new MIG pod on nodes of GPUS A100-80GB in MIG mode."""
    specs = [
        NodeSpec(f"n{i}", 64_000, 256 * GiB, GPUS, MODEL, gpu_memory_bytes=80 * GiB, mig_gpus=GPUS)
        for i in range(nodes)
    ]
    ledger = cluster_ledger(specs)
    for flat, start in held:
        node, g = divmod(flat, GPUS)
        instance = MigInstance(GEOMETRY.profile(profile), start)
        held_one = ledger.reserve_mig(node, g, instance, Request(1000, mig_profile=profile))
        assert isinstance(held_one, Placement)
    context = PolicyContext(rng=np.random.default_rng(0))
    placer = Placer(ledger, placement_policy("bestfit")(ledger.view, context))
    # the one choice over every MIG GPU of the cluster: what the placer's per-node shortcut must give
    whole = choose_mig_instance(created_candidates(ledger.view, ledger.mig_gpus, profile))
    placed = placer.place(Request(1000, mig_profile=profile))
    assert isinstance(placed, Placement) and placed.mig is not None, placed
    assert whole is not None and (placed.node, placed.mig.gpu) == whole[0].key
    assert placed.mig.instance == whole[1]
    ledger.check_invariants()
    return placed.node, placed.mig.gpu, placed.mig.instance.start


@pytest.mark.parametrize("profile", ["1g.10gb", "2g.20gb", "3g.40gb"])
def test_serve_the_extender_and_sim_take_the_same_mig_instance(profile):
    choices = set()
    for seed in range(20):
        held = held_instances(profile, seed)
        serve = serve_choice(profile, held)
        assert (0, *serve) == extender_choice(profile, held), (seed, held)
        assert (0, *serve) == sim_choice(profile, held), (seed, held)
        choices.add(serve)
    assert len(choices) >= 3  # the states differ enough to move the choice around


@pytest.mark.parametrize("profile", ["1g.10gb", "2g.20gb", "3g.40gb"])
def test_sim_and_the_deciding_extender_take_the_same_node_and_instance(profile):
    """Over three nodes the node is part of the one choice (the fullest GPU anywhere), not the
    placement policy's: sim's placer and the extender's --decide filter agree on node, GPU and start."""
    nodes, choices = 3, set()
    starts = GEOMETRY.profile(profile).starts
    every = [(flat, s) for flat in range(nodes * GPUS) for s in starts]
    for seed in range(15):
        rng = random.Random(seed)
        held = rng.sample(every, rng.randint(0, len(every) - 1))
        sim = sim_choice(profile, held, nodes)
        assert sim == extender_choice(profile, held, nodes, decide=True), (seed, held)
        choices.add(sim[0])
    assert len(choices) >= 2  # the chosen node moves with the state
