"""The extender deciding where a pod goes (filter narrowed to the placement policy's choice), answering
kube-schedulers that send whole Nodes, and preempting lower-priority pods itself where only it refuses
a node (kube-scheduler's own preemption never reaches it there)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_extender import (
    FakeApi,
    _bound_pod,
    args,
    binding,
    client_for,
    inventory,
    node_event,
    pod_json,
)

from gpuslice.k8s.annotations import (
    ANNOTATION_GPU_MODELS,
    ANNOTATION_PLACEMENT_POLICY,
    pod_gpu_request,
)
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.extender import REASON_RESERVED, ClusterState, WatchEvent
from gpuslice.k8s.extender import preemption as extender_preemption
from gpuslice.policies import PolicyContext, placement_policy
from gpuslice.scheduler.placer import Placer

SHARE = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "20000", "gpuslice.io/gpucores": "20"}


def narrow_state(api: FakeApi, nodes: dict[str, Any], policy: str = "bestfit") -> ClusterState:
    state = ClusterState(api, default_policy=policy, narrow=True)
    for name, inv in nodes.items():
        state.apply(node_event(name, inv))
    return state


def with_priority(pod: dict[str, Any], priority: int) -> dict[str, Any]:
    pod["spec"]["priority"] = priority
    return pod


# ---- deciding ------------------------------------------------------------------------------------------


def test_filter_passes_only_the_node_the_policy_chooses_and_says_why_for_the_others():
    api = FakeApi()
    state = narrow_state(api, {"a": inventory(), "b": inventory(), "c": inventory()})
    state.apply(WatchEvent("Pod", "ADDED", _bound_pod("old", "b", "3", SHARE)))
    with client_for(state) as http:
        reply = http.post("/filter", json=args(pod_json("new", SHARE), ["a", "b", "c"])).json()
    assert reply["NodeNames"] == ["b"]  # bestfit: the node whose GPU is already in use
    assert reply["FailedNodes"] == {"a": "gpuslice (bestfit) chose b", "c": "gpuslice (bestfit) chose b"}


@pytest.mark.parametrize("policy", ["bestfit", "fgd", "dotprod", "hami-spread", "clustering"])
def test_the_chosen_node_is_the_one_the_shared_placer_chooses(policy):
    """The same Placer (scores, tie rule) as gpuslice sim, over the nodes kube-scheduler offered."""
    api = FakeApi()
    state = narrow_state(api, {f"n{i}": inventory(gpus=2 + i % 3) for i in range(6)}, policy)
    for i, node in enumerate(["n1", "n1", "n4"]):
        state.apply(WatchEvent("Pod", "ADDED", _bound_pod(f"p{i}", node, str(i % 2), SHARE)))
    pod = pod_json("x", SHARE, {ANNOTATION_PLACEMENT_POLICY: policy})
    offered = ["n0", "n1", "n3", "n4", "n5"]  # n2 dropped by kube-scheduler's own filters
    built = state.cache.ledgered()
    placer = Placer(
        built.ledger,
        placement_policy(policy)(
            built.ledger.view, PolicyContext(rng=np.random.default_rng(0), target=built.targets)
        ),
    )
    mask = np.zeros(built.ledger.node_count, dtype=bool)
    mask[[built.index[n] for n in offered]] = True
    request = pod_gpu_request(pod).to_request()
    expected = built.ledger.node_names[placer.choose_node(request, mask & placer.feasible(request))]
    chosen = state.filter(pod, offered).passed
    assert chosen == [expected]


def test_the_chosen_nodes_gpus_are_held_from_filter_until_bind():
    """kube-scheduler binds asynchronously and filters the next pod first: that filter must see the
    previous pod placed, or two pods are placed against the same state."""
    api = FakeApi()
    state = narrow_state(api, {"a": inventory(gpus=1), "b": inventory(gpus=1)})
    half = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "50000"}
    first, second = pod_json("first", half), pod_json("second", half)
    assert state.filter(first, ["a", "b"]).passed == ["a"]
    assert state.filter(second, ["a", "b"]).passed == ["b"]  # a's GPU is held for "first"
    api.pods[("team-a", "first")] = first
    assert state.bind("team-a", "first", "uid-first", "a") == ""
    assert state.cache.assumed == {"uid-second": state.cache.assumed["uid-second"]}
    state.check_invariants()


def test_bind_keeps_the_hold_from_filter_so_no_other_filter_can_take_it_in_between():
    """Bind used to give the hold back and pick again: another pod filtered in that moment saw the GPU
    free, chose it, and its own bind then failed with "no longer fits"."""
    api = FakeApi()
    state = narrow_state(api, {"a": inventory(gpus=1)})
    whole = {"gpuslice.io/gpu": "1"}
    first = pod_json("first", whole)
    assert state.filter(first, ["a"]).passed == ["a"]
    held = state.cache.pods["uid-first"].placement
    released = []
    original = state.cache.forget
    state.cache.forget = lambda uid: (released.append(uid), original(uid))[1]  # type: ignore[method-assign]
    api.pods[("team-a", "first")] = first
    assert state.bind("team-a", "first", "uid-first", "a") == ""
    assert released == [] and state.cache.pods["uid-first"].placement is held
    assert state.filter(pod_json("second", whole), ["a"]).passed == []


def test_a_bind_to_another_node_than_filter_held_decides_on_that_node_and_gives_the_hold_back():
    """kube-scheduler may bind elsewhere than the extender's filter assumed (another filter's verdict, a
    retry after the cluster changed): the decision the device plugin reads must name the bind's node and
    GPUs there, and the hold on the filter's node must go."""
    api = FakeApi()
    state = narrow_state(api, {"a": inventory(gpus=1), "b": inventory(gpus=1)})
    whole = {"gpuslice.io/gpu": "1"}
    pod = pod_json("first", whole)
    assert state.filter(pod, ["a", "b"]).passed == ["a"]
    api.pods[("team-a", "first")] = pod
    assert state.bind("team-a", "first", "uid-first", "b") == ""
    (_, _, written), *_ = api.patches
    decision = Decision.from_annotations(written)
    assert decision is not None and decision.node == "b"
    assert state.cache.pods["uid-first"].node == "b"
    assert state.filter(pod_json("second", whole), ["a"]).passed == ["a"]  # a's GPU is free again
    state.check_invariants()


def test_a_pod_filtered_again_does_not_count_its_own_hold():
    api = FakeApi()
    state = narrow_state(api, {"a": inventory(gpus=1)})
    whole = pod_json("whole", {"gpuslice.io/gpu": "1"})
    assert state.filter(whole, ["a"]).passed == ["a"]
    assert state.filter(whole, ["a"]).passed == ["a"]  # e.g. its bind was never sent
    assert api.deleted == []


def test_without_deciding_every_fitting_node_passes():
    api = FakeApi()
    state = ClusterState(api)  # narrow=False: kube-scheduler weighs the scores
    for name in ("a", "b"):
        state.apply(node_event(name, inventory()))
    assert state.filter(pod_json("x", SHARE), ["a", "b"]).passed == ["a", "b"]


# ---- whole Nodes (nodeCacheCapable: false) --------------------------------------------------------------


def test_filter_answers_whole_nodes_in_nodes_items_when_kube_scheduler_sent_nodes():
    """Without nodeCacheCapable kube-scheduler reads only Nodes.items from the reply: a reply with
    NodeNames alone leaves every pod unschedulable."""
    api = FakeApi()
    state = ClusterState(api)
    for name in ("a", "t4"):
        state.apply(
            node_event(name, inventory() if name == "a" else inventory("T4", gpus=1, memory_mib=15109))
        )
    nodes = {
        "metadata": {"resourceVersion": "7"},
        "items": [
            {"metadata": {"name": "a", "labels": {"x": "1"}}, "status": {}},
            {"metadata": {"name": "t4"}, "status": {}},
        ],
    }
    body = {"Pod": pod_json("x", SHARE), "Nodes": nodes, "NodeNames": None}
    with client_for(state) as http:
        reply = http.post("/filter", json=body).json()
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["a"]
    assert reply["Nodes"]["items"][0] == nodes["items"][0]  # the object as sent
    assert "t4" in reply["FailedNodes"]


def test_a_node_names_request_gets_no_nodes_field():
    api = FakeApi()
    state = ClusterState(api)
    state.apply(node_event("a", inventory()))
    with client_for(state) as http:
        reply = http.post("/filter", json=args(pod_json("x", SHARE), ["a"])).json()
    assert "Nodes" not in reply and reply["NodeNames"] == ["a"]


# ---- preemption by the extender --------------------------------------------------------------------------

BIG = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "60000"}


def full_node(api: FakeApi) -> ClusterState:
    """One 2-GPU A100 node; a low (priority 10) and a mid (priority 50) pod hold 60 GB on one GPU each."""
    state = narrow_state(api, {"n": inventory(gpus=2)})
    for name, gpu, priority in (("low", "0", 10), ("mid", "1", 50)):
        state.apply(WatchEvent("Pod", "ADDED", with_priority(_bound_pod(name, "n", gpu, BIG), priority)))
    return state


def test_a_pod_only_the_extender_refuses_preempts_the_least_important_victim():
    api = FakeApi()
    state = full_node(api)
    high = with_priority(pod_json("high", BIG), 100)
    result = state.filter(high, ["n"])
    assert result.passed == []
    assert api.deleted == [("team-a", "low", "uid-low")]  # one victim is enough; the least important
    state.flush_events()
    reasons = {(name, reason) for _, name, reason, _ in api.events}
    assert ("low", "Preempted") in reasons and ("high", "FailedScheduling") in reasons
    # retried before the victim is gone: nothing more is deleted, the pod is told to wait
    state.filter(high, ["n"])
    assert len(api.deleted) == 1


@pytest.mark.parametrize(
    ("priority", "deleted"), [(10, []), (5, []), (11, [("team-a", "low", "uid-low")])],
    ids=["equal", "lower", "one-higher"],
)  # fmt: skip
def test_only_a_pod_of_higher_priority_than_the_victim_preempts_it(priority, deleted):
    api = FakeApi()
    state = full_node(api)
    state.filter(with_priority(pod_json("peer", BIG), priority), ["n"])
    assert api.deleted == deleted


def test_the_room_a_preemption_made_is_held_for_the_preemptor():
    api = FakeApi()
    state = full_node(api)
    high = with_priority(pod_json("high", BIG), 100)
    state.filter(high, ["n"])
    state.apply(WatchEvent("Pod", "DELETED", _bound_pod("low", "n", "0", BIG)))  # the kubelet removed it
    sneaky = with_priority(pod_json("sneaky", BIG), 20)
    refused = state.filter(sneaky, ["n"])
    assert refused.passed == [] and refused.failed["n"] == REASON_RESERVED
    assert state.bind("team-a", "sneaky", "uid-sneaky", "n").endswith(REASON_RESERVED)
    assert state.filter(high, ["n"]).passed == ["n"]
    api.pods[("team-a", "high")] = high
    assert state.bind("team-a", "high", "uid-high", "n") == ""
    # bound: the node is nobody's reservation any more
    assert state.cache.nominations == {}


def test_a_lower_priority_pod_neither_evicts_the_same_victim_again_nor_takes_the_nomination():
    """While a preemptor waits for its victim to go, a pod of lower priority asking for the same room
    finds nothing to preempt there: the victim is going already (the one search never counts a pod being
    preempted), and the node's room is held for the more important pod."""
    api = FakeApi()
    state = full_node(api)
    state.filter(with_priority(pod_json("high", BIG), 100), ["n"])
    assert api.deleted == [("team-a", "low", "uid-low")]
    state.filter(with_priority(pod_json("second", BIG), 60), ["n"])  # could evict "mid" (50), but not here
    assert api.deleted == [("team-a", "low", "uid-low")]
    assert [h.uid for h in state.cache.nominations.values()] == ["uid-high"]
    assert state.preemptions == 1
    # a more important pod may clear the node for itself, but not by evicting the pod already going
    state.filter(with_priority(pod_json("urgent", BIG), 200), ["n"])
    assert api.deleted == [("team-a", "low", "uid-low"), ("team-a", "mid", "uid-mid")]


def test_a_victim_deleted_before_the_watch_says_so_does_not_hold_up_the_preemptor():
    """kube-scheduler retries the preemptor as soon as it sees the victim deleted; the extender's own
    watch may be later. It asks the API server about the victims instead of refusing the pod."""
    api = FakeApi()
    state = full_node(api)
    high = with_priority(pod_json("high", BIG), 100)
    state.filter(high, ["n"])
    assert state.filter(high, ["n"]).passed == []  # victim still there
    api.gone.add("uid-low")  # deleted on the API server; no watch event yet
    assert state.filter(high, ["n"]).passed == ["n"]


@pytest.mark.parametrize(
    ("want_mb", "deleted"), [("30000", []), ("20000", [("team-a", "small", "uid-small")])],
    ids=["evicting-would-not-make-room", "evicting-makes-just-enough-room"],
)  # fmt: skip
def test_a_victim_is_evicted_only_when_that_makes_room(want_mb, deleted):
    """An 80 GB GPU holds 60 GB (priority 1000) and 10 GB (priority 1): evicting the small pod frees 20 GB,
    enough for 20 GB and not for 30 GB; the big one outranks the preemptor."""
    api = FakeApi()
    state = narrow_state(api, {"n": inventory(gpus=1)})
    small = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "10000"}
    state.apply(WatchEvent("Pod", "ADDED", with_priority(_bound_pod("big", "n", "0", BIG), 1000)))
    state.apply(WatchEvent("Pod", "ADDED", with_priority(_bound_pod("small", "n", "0", small), 1)))
    state.filter(with_priority(pod_json("want", {**BIG, "gpuslice.io/gpumem": want_mb}), 100), ["n"])
    assert api.deleted == deleted


@pytest.mark.parametrize(
    ("pin", "deleted"), [("H100", []), ("A100-80GB", [("team-a", "low", "uid-low")])],
    ids=["pinned-to-a-model-the-node-lacks", "pinned-to-the-nodes-model"],
)  # fmt: skip
def test_preemption_respects_the_pods_model_pin(pin, deleted):
    api = FakeApi()
    state = full_node(api)
    high = with_priority(pod_json("high", BIG, {ANNOTATION_GPU_MODELS: pin}), 100)
    state.filter(high, ["n"])
    assert api.deleted == deleted


def test_the_extender_preempts_through_the_one_search(monkeypatch):
    """With the one search of every home answering "no plan", the extender evicts nothing."""
    calls = []
    monkeypatch.setattr(extender_preemption, "find_preemption", lambda *a, **k: calls.append(a[0]))
    api = FakeApi()
    full_node(api).filter(with_priority(pod_json("high", BIG), 100), ["n"])
    assert api.deleted == [] and [(c.job_id, c.priority) for c in calls] == [("uid-high", 100)]


def test_bind_of_the_preemptor_works_through_the_http_app():
    api = FakeApi()
    state = full_node(api)
    high = with_priority(pod_json("high", BIG), 100)
    api.pods[("team-a", "high")] = high
    with client_for(state) as http:
        http.post("/filter", json=args(high, ["n"]))
        state.apply(WatchEvent("Pod", "DELETED", _bound_pod("low", "n", "0", BIG)))
        assert http.post("/filter", json=args(high, ["n"])).json()["NodeNames"] == ["n"]
        assert http.post("/bind", json=binding(high, "n")).json() == {"Error": ""}
