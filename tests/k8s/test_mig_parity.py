"""One MIG choice in every home that places MIG requests: on the same MIG GPUs holding the same
instances, serve's node scheduler (which creates the instance) and the Kubernetes extender (which picks
one of the instances the device plugin advertises, here every start of the profile) give the same GPU
and start, both through ``scheduler/mig_choice.py`` and the MIG placement policy. (sim has no MIG.)"""

from __future__ import annotations

import random

import pytest
from test_extender import FakeApi, inventory, make_state, pod_json

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.mig import mig_gpu
from gpuslice.k8s.annotations import Decision, MigChoice, MigSlot
from gpuslice.k8s.extender import WatchEvent
from gpuslice.scheduler.node_scheduler import MigAssignment, NodeScheduler, StartJob
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec

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


def extender_choice(profile: str, held: list[tuple[int, int]]) -> tuple[int, int]:
    starts = GEOMETRY.profile(profile).starts
    slots = {g: tuple(MigSlot(profile, s, f"MIG-{g}-{s}") for s in starts) for g in range(GPUS)}
    state = make_state(FakeApi(), {"n": inventory(MODEL, gpus=GPUS, mig=slots)})
    resources = {f"gpuslice.io/mig-{profile}": "1"}
    for k, (g, s) in enumerate(held):
        mig = MigChoice(g, profile, s, f"MIG-{g}-{s}")
        decision = Decision("n", "train", (g,), (f"GPU-{MODEL}-{g:02d}",), 0, 100, mig)
        state.apply(
            WatchEvent("Pod", "ADDED", pod_json(f"held-{k}", resources, decision.to_annotations(), node="n"))
        )
    pod = pod_json("new", resources)
    assert state.filter(pod, ["n"]).passed == ["n"]
    assert state.bind("team-a", "new", "uid-new", "n") == ""
    decision = Decision.from_annotations(state.api.patches[-1][2])  # type: ignore[attr-defined]
    assert decision is not None and decision.mig is not None
    state.check_invariants()
    return decision.mig.gpu_index, decision.mig.start


@pytest.mark.parametrize("profile", ["1g.10gb", "2g.20gb", "3g.40gb"])
def test_serve_and_the_extender_take_the_same_mig_instance(profile):
    choices = set()
    for seed in range(20):
        held = held_instances(profile, seed)
        serve = serve_choice(profile, held)
        assert serve == extender_choice(profile, held), (seed, held)
        choices.add(serve)
    assert len(choices) >= 3  # the states differ enough to move the choice around
