"""One fit rule for the extender's filter and its preemption what-if: evicting pods makes a pod fit in
the what-if exactly when, once those pods are gone, the filter lets the pod onto the node."""

from __future__ import annotations

import itertools
import random

import pytest
from test_extender import FakeApi, _bound_pod, inventory, make_state, pod_json

from gpuslice.k8s.extender import ClusterState, WatchEvent

# (name, GPU, cores %, MiB) of the pods bound on one node of 2 GPUs x 16 GiB with 3 shares per GPU
BOUND = [
    ("a", 0, 30, 4000),
    ("b", 0, 30, 4000),
    ("c", 0, 20, 6000),
    ("d", 1, 60, 8000),
    ("e", 1, 20, 2000),
]
ASKS = [  # what the new pod asks for
    {"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "30", "gpuslice.io/gpumem": "4000"},
    {"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "50", "gpuslice.io/gpumem": "9000"},
    {"gpuslice.io/gpu": "1"},
    {"gpuslice.io/gpu": "2"},
]


def share(cores: int, mib: int) -> dict[str, str]:
    return {"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": str(cores), "gpuslice.io/gpumem": str(mib)}


def bound_state() -> ClusterState:
    state = make_state(FakeApi(), {"n": inventory(gpus=2, memory_mib=16384, split=3)})
    for name, gpu, cores, mib in BOUND:
        state.apply(WatchEvent("Pod", "ADDED", _bound_pod(name, "n", str(gpu), share(cores, mib))))
    return state


@pytest.mark.parametrize("ask", ASKS, ids=["share-30", "share-50-9G", "whole", "two-whole"])
def test_preemption_what_if_agrees_with_the_filter_once_the_victims_are_gone(ask):
    names = [name for name, *_ in BOUND]
    subsets = [s for r in range(len(names) + 1) for s in itertools.combinations(names, r)]
    outcomes: set[bool] = set()
    for victims in [*random.Random(0).sample(subsets, 12), (), tuple(names)]:
        state = bound_state()
        pod = pod_json("new", ask)
        pod["spec"]["priority"] = 100  # kube-scheduler proposes only pods of lower priority as victims
        what_if = state.preempt(pod, {"n": [f"uid-{v}" for v in victims]}) == {
            "n": [f"uid-{v}" for v in victims]
        }
        for v in victims:
            state.apply(WatchEvent("Pod", "DELETED", _bound_pod(v, "n", "0", {})))
        assert what_if == (state.filter(pod, ["n"]).passed == ["n"]), victims
        state.check_invariants()
        outcomes.add(what_if)
    assert outcomes == {True, False}  # some evictions make room and some do not, for every ask
