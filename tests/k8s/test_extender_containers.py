"""Pods where several containers ask for slices: each app container gets its own slice on the pod's node,
held together or not at all; an init container runs inside the first slice (Kubernetes' peak rule)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from test_extender import FakeApi, inventory, make_state, pod_json

from gpuslice.errors import InvalidRequest
from gpuslice.k8s.annotations import (
    ANNOTATION_CONTAINER_SLICES,
    ANNOTATION_GPU_INDICES,
    ANNOTATION_GPUMEM_MIB,
    pod_gpu_request,
)
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.extender import ClusterState, WatchEvent
from gpuslice.k8s.node_lock import ask_key

MiB = 1 << 20
SHARE = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "40000", "gpuslice.io/gpucores": "30"}
SMALL = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "10000", "gpuslice.io/gpucores": "10"}


def two_container_pod(
    name: str, first: Mapping[str, str], second: Mapping[str, str], init: Mapping[str, str] | None = None
) -> dict[str, Any]:
    pod = pod_json(name, first)
    pod["spec"]["containers"][1]["resources"] = {"limits": dict(second)}
    if init is not None:
        pod["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": dict(init)}}]
    return pod


def test_each_app_container_is_its_own_ask_and_an_init_container_rides_inside_the_first():
    ask = pod_gpu_request(two_container_pod("p", SHARE, SMALL, init=SMALL))
    assert [c.container for c in ask.containers] == ["train", "log-shipper"]
    assert [c.memory_mib for c in ask.containers] == [40000, 10000]
    assert [c.container for c in ask.init] == ["warm"] and ask.multi
    assert ask_key(ask) == ""  # several Allocate calls: the whole node's lock
    only_init = pod_json("q", {"cpu": "1"})
    only_init["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": SMALL}}]
    alone = pod_gpu_request(only_init)
    assert (alone.container, alone.memory_mib, alone.multi) == ("warm", 10000, False)


@pytest.mark.parametrize(
    ("init", "message"),
    [
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "50000"}, "more than container 'train'"),
        ({"gpuslice.io/gpu": "1"}, "asks for 1 GPU, more than container 'train'"),  # the whole GPU
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "100", "gpuslice.io/gpucores": "90"}, "more than"),
        ({"gpuslice.io/mig-1g.10gb": "1"}, "asks for MIG 1g.10gb, more than"),
    ],
)
def test_an_init_container_that_does_not_fit_in_the_first_slice_is_refused(init, message):
    with pytest.raises(InvalidRequest, match=message):
        pod_gpu_request(two_container_pod("p", SHARE, {"cpu": "1"}, init=init))


def test_a_sidecar_asking_for_a_slice_is_refused_with_what_to_do():
    pod = two_container_pod("p", SHARE, {"cpu": "1"}, init=SMALL)
    pod["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    with pytest.raises(InvalidRequest, match=r"sidecar .* ask in an app container"):
        pod_gpu_request(pod)


def test_a_node_takes_the_pod_only_when_every_container_fits_there_together():
    api = FakeApi()
    # one GPU of 80 GiB: 40000 + 10000 MiB fit, 40000 + 50000 do not (each alone would)
    state = make_state(api, {"n": inventory(gpus=1)})
    big = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "50000", "gpuslice.io/gpucores": "10"}
    too_much = state.filter(two_container_pod("p", SHARE, big), ["n"])
    assert too_much.passed == [] and "for every container together" in too_much.failed["n"]
    assert "container 'log-shipper': 50000 MiB, 10 % of 1 GPU" in too_much.failed["n"]
    state.check_invariants()  # the what-if gave back all it tried
    assert state.ledger.view.free_gpu_memory_bytes[0, 0] == 81920 * MiB
    assert state.filter(two_container_pod("q", SHARE, SMALL), ["n"]).passed == ["n"]


def _bind(state: ClusterState, api: FakeApi, pod: dict[str, Any], node: str) -> Decision:
    api.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
    assert state.filter(pod, [node]).passed == [node]
    assert (
        state.bind(pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"], node) == ""
    )
    decision = Decision.from_annotations(api.annotations_of(pod["metadata"]["name"]))
    assert decision is not None
    return decision


def test_bind_holds_every_containers_slice_and_writes_them_in_the_kubelets_order():
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=2)})
    decision = _bind(state, api, two_container_pod("p", SHARE, SMALL, init=SMALL), "n")
    assert [(c.container, c.inside) for c in decision.containers] == [
        ("warm", True), ("train", False), ("log-shipper", False),
    ]  # fmt: skip
    warm, train, shipper = decision.containers
    assert (train.memory_mib, train.cores_percent, shipper.memory_mib, shipper.cores_percent) == (
        40000,
        30,
        10000,
        10,
    )
    assert warm.gpu_indices == train.gpu_indices and (warm.memory_mib, warm.cores_percent) == (10000, 10)
    # the keys every older reader knows describe the first app container
    assert (decision.container, decision.gpu_indices, decision.memory_mib) == (
        "train",
        train.gpu_indices,
        40000,
    )
    free = state.ledger.view.free_gpu_memory_bytes[0, :2].sum()
    assert free == (2 * 81920 - 40000 - 10000) * MiB  # two slices held; the init container adds nothing
    state.check_invariants()


def test_a_restarted_extender_holds_every_slice_from_the_annotations_and_the_pods_end_frees_them():
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=2)})
    pod = two_container_pod("p", SHARE, SMALL, init=SMALL)
    _bind(state, api, pod, "n")
    bound = copy.deepcopy(pod)
    bound["metadata"]["annotations"].update(api.annotations_of("p"))
    bound["spec"]["nodeName"] = "n"
    fresh = make_state(FakeApi(), {"n": inventory(gpus=2)})
    fresh.apply(WatchEvent("Pod", "ADDED", bound))
    held = fresh.ledger.view.free_gpu_memory_bytes[0, :2].sum()
    assert held == state.ledger.view.free_gpu_memory_bytes[0, :2].sum() == (2 * 81920 - 50000) * MiB
    assert fresh.conflicts == 0
    fresh.apply(WatchEvent("Pod", "DELETED", bound))
    assert fresh.ledger.view.free_gpu_memory_bytes[0, :2].sum() == 2 * 81920 * MiB
    fresh.check_invariants()


def test_a_bind_where_a_later_container_no_longer_fits_holds_nothing():
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=1)})
    pod = two_container_pod("p", SHARE, SMALL)
    api.pods[("team-a", "p")] = pod
    assert state.filter(pod, ["n"]).passed == ["n"]
    # another pod takes the room the second container needed before this pod's bind
    other = two_container_pod("o", {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "35000"}, {"cpu": "1"})
    api.pods[("team-a", "o")] = other
    assert state.bind("team-a", "o", "uid-o", "n") == ""
    problem = state.bind("team-a", "p", "uid-p", "n")
    assert "container 'log-shipper'" in problem and "no longer fits" in problem
    assert state.ledger.view.free_gpu_memory_bytes[0, 0] == (81920 - 35000) * MiB  # p holds nothing
    state.check_invariants()


def test_the_decision_annotations_round_trip_and_a_malformed_slice_list_is_refused():
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=2)})
    decision = _bind(state, api, two_container_pod("p", SHARE, SMALL), "n")
    written = decision.to_annotations()
    assert Decision.from_annotations(written) == decision
    assert written[ANNOTATION_GPU_INDICES] and written[ANNOTATION_GPUMEM_MIB] == "40000"
    for bad in ("{", '{"a": 1}', '[{"gpuIndices": [0]}]', '[{"container": "x", "gpuIndices": ["z"]}]'):
        with pytest.raises(InvalidRequest):
            Decision.from_annotations({**written, ANNOTATION_CONTAINER_SLICES: bad})
    assert decision.current().container == "train" and decision.allocated == 0
    second = Decision.from_annotations({**written, "gpuslice.io/allocated-containers": "1"})
    assert second is not None and second.current().container == "log-shipper"
    assert second.current().memory_mib == 10000


def test_a_pod_where_only_init_containers_ask_gets_the_first_ones_slice_and_runs_the_others_inside():
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=2)})
    pod = pod_json("p", {"cpu": "1"})
    pod["spec"]["initContainers"] = [
        {"name": "fetch", "resources": {"limits": SHARE}},
        {"name": "check", "resources": {"limits": SMALL}},
    ]
    decision = _bind(state, api, pod, "n")
    assert [(c.container, c.inside) for c in decision.containers] == [("fetch", False), ("check", True)]
    assert decision.containers[1].gpu_indices == decision.containers[0].gpu_indices
    assert state.ledger.view.free_gpu_memory_bytes[0, :2].sum() == (2 * 81920 - 40000) * MiB
