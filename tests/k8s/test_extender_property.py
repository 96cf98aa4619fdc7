"""Property: no sequence of pods through filter -> prioritize -> bind (with deletions) over-commits a GPU.

The check is independent of the ledger: it adds up the decisions the extender wrote (what the device
plugin would enforce) per physical GPU and compares them with the inventory.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_extender import FakeApi, binding, inventory, make_state, pod_json

from gpuslice.k8s.annotations import (
    MigSlot,
)
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.extender import WatchEvent

NODES = {
    "a": inventory("A100-80GB", gpus=2, memory_mib=81920, split=3),
    "b": inventory("T4", gpus=1, memory_mib=15109, split=4),
    "c": inventory("H100", gpus=4, memory_mib=81559, split=2),
    "m": inventory(
        "A100-80GB", gpus=2, mig={1: (MigSlot("3g.40gb", 0, "MIG-1"), MigSlot("3g.40gb", 4, "MIG-2"))}
    ),
}
CAPACITY_MIB = {name: inv.gpus[0].memory_mib for name, inv in NODES.items()}
SPLIT = {name: inv.split_count for name, inv in NODES.items()}

pods = st.one_of(
    st.fixed_dictionaries({"gpuslice.io/gpu": st.sampled_from(["1", "2", "3"])}),
    st.fixed_dictionaries(
        {
            "gpuslice.io/gpu": st.just("1"),
            "gpuslice.io/gpumem": st.integers(500, 90_000).map(str),
            "gpuslice.io/gpucores": st.integers(1, 100).map(str),
        }
    ),
    st.fixed_dictionaries(
        {"gpuslice.io/gpu": st.just("1"), "gpuslice.io/gpumem": st.integers(500, 20_000).map(str)}
    ),
    st.just({"gpuslice.io/mig-3g.40gb": "1"}),
)
policies = st.sampled_from(["", "bestfit", "fgd", "random", "hami-spread"])
steps = st.lists(
    st.one_of(st.tuples(st.just("pod"), pods, policies), st.tuples(st.just("delete"), st.integers(0, 50))),
    min_size=1,
    max_size=25,
)


def _overcommitted(live: dict[str, tuple[dict[str, str], Decision]]) -> list[str]:
    milli: dict[tuple[str, int], int] = defaultdict(int)
    memory: dict[tuple[str, int], int] = defaultdict(int)
    shares: dict[tuple[str, int], int] = defaultdict(int)
    migs: set[tuple[str, int, int]] = set()
    problems = []
    for resources, d in live.values():
        if d.mig is not None:
            key = (d.node, d.mig.gpu_index, d.mig.start)
            if key in migs:
                problems.append(f"MIG instance {key} given twice")
            migs.add(key)
            continue
        whole = "gpuslice.io/gpumem" not in resources and "gpuslice.io/gpucores" not in resources
        for g in d.gpu_indices:
            milli[(d.node, g)] += 1000 if whole else (d.cores_percent * 10 or 1)
            memory[(d.node, g)] += d.memory_mib or CAPACITY_MIB[d.node]
            shares[(d.node, g)] += 1
    for key, used in milli.items():
        if used > 1000 or memory[key] > CAPACITY_MIB[key[0]] or shares[key] > SPLIT[key[0]]:
            problems.append(f"GPU {key}: {used} milli, {memory[key]} MiB, {shares[key]} shares")
        if key[0] == "m" and key[1] == 1:
            problems.append("a share landed on the MIG-mode GPU")
    return problems


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_no_sequence_of_pods_overcommits_a_gpu(steps: list[tuple[Any, ...]]):
    api = FakeApi()
    state = make_state(api, NODES)
    names = list(NODES)
    live: dict[str, tuple[dict[str, str], Decision]] = {}
    pods_by_name: dict[str, dict[str, Any]] = {}
    for i, step in enumerate(steps):
        state.check_invariants()  # includes: no cached filter verdict outlived a change of its node
        if step[0] == "delete":
            if live:
                victim = sorted(live)[step[1] % len(live)]
                del live[victim]
                state.apply(WatchEvent("Pod", "DELETED", pods_by_name[victim]))
            continue
        _, resources, policy = step
        name = f"p{i}"
        annotations = {"gpuslice.io/placement-policy": policy} if policy else {}
        pod = pod_json(name, resources, annotations)
        api.pods[("team-a", name)] = pod
        pods_by_name[name] = pod
        passed = state.filter(pod, names).passed
        if not passed:
            continue
        scores = dict(state.prioritize(pod, passed))
        assert all(0 <= s <= 10 for s in scores.values())
        node = max(passed, key=lambda n: scores[n])
        b = binding(pod, node)
        error = state.bind(b["PodNamespace"], b["PodName"], b["PodUID"], b["Node"])
        assert error == "", error  # filter said it fits and nothing ran in between: bind must succeed
        decision = Decision.from_annotations(api.annotations_of(name))
        assert decision is not None and decision.node == node
        live[name] = (dict(resources), decision)
        assert _overcommitted(live) == []
    state.check_invariants()
