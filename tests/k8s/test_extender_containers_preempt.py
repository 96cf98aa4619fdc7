"""Preemption for a pod where several containers ask for slices: a victim set is good only if, with the
victims' slices given back, every container's slice fits on the node together (``pod_slices.fits_without``),
for the extender's own evictions and for kube-scheduler's candidates alike; each what-if leaves the ledger
as it found it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from test_extender import FakeApi, _bound_pod, inventory, node_event, pod_json
from test_extender_containers import two_container_pod
from test_extender_decide import narrow_state, with_priority

from gpuslice.k8s.decision import ContainerDecision, Decision
from gpuslice.k8s.extender import REASON_RESERVED, ClusterState, WatchEvent, pod_slices
from gpuslice.k8s.extender import preemption as extender_preemption
from gpuslice.k8s.extender.cluster import pod_ask
from gpuslice.k8s.extender.verdicts import CODE_GPU

MiB = 1 << 20
BIG = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "60000"}  # two do not fit on one 80 GiB GPU
HALF = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "30000"}


def bound(state: ClusterState, name: str, node: str, gpu: int, priority: int, ask: Mapping[str, str]) -> None:
    """A pod of one slice bound on ``gpu`` of ``node`` before the extender started (its watch sees it)."""
    pod = with_priority(_bound_pod(name, node, str(gpu), ask), priority)
    state.apply(WatchEvent("Pod", "ADDED", pod))


def bound_two_slices(state: ClusterState, name: str, node: str, gpus: tuple[int, int], priority: int) -> None:
    """A pod whose two app containers hold 30000 MiB each, on ``gpus[0]`` and ``gpus[1]``."""
    slices = tuple(
        ContainerDecision(container, (gpu,), (), 30000, 100)
        for container, gpu in zip(("train", "log-shipper"), gpus, strict=True)
    )
    decision = Decision(node, "train", (gpus[0],), (), 30000, 100, containers=slices)
    pod = with_priority(two_container_pod(name, HALF, HALF), priority)
    pod["metadata"]["annotations"].update(decision.to_annotations())
    pod["spec"]["nodeName"] = node
    state.apply(WatchEvent("Pod", "ADDED", pod))


def preemptor(name: str = "both", priority: int = 100) -> dict[str, Any]:
    """Two app containers of 60000 MiB each: they need two GPUs of 80 GiB with room."""
    return with_priority(two_container_pod(name, BIG, BIG), priority)


def columns(state: ClusterState) -> tuple[np.ndarray, ...]:
    view = state.ledger.view
    return tuple(
        a.copy() for a in (view.free_gpu_milli, view.free_gpu_memory_bytes, view.gpu_tasks, view.version)
    )


def same_capacity(before: tuple[np.ndarray, ...], after: tuple[np.ndarray, ...]) -> bool:
    """Free compute, free memory and share counts equal (the row versions move with every what-if)."""
    return all(np.array_equal(b, a) for b, a in zip(before[:3], after[:3], strict=True))


def test_a_pod_of_two_slices_preempts_the_cheapest_victims_that_free_room_for_both():
    """On "n" the pod needs "a" and the two-slice pod "b" gone, not "tiny", whose GPU still has room once
    "a" goes; "m" could be cleared too, of pods of lower priority, but they hold half of each GPU's compute
    (the search's cost counts GPUs freed first)."""
    api = FakeApi()
    state = narrow_state(api, {"m": inventory(gpus=2), "n": inventory(gpus=2)})
    bound(state, "a", "n", 0, 10, BIG)
    bound(state, "tiny", "n", 0, 5, {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "10000"})
    bound_two_slices(state, "b", "n", (1, 1), 20)
    bound(state, "c", "m", 0, 1, {**BIG, "gpuslice.io/gpucores": "50"})
    bound(state, "d", "m", 1, 1, {**BIG, "gpuslice.io/gpucores": "50"})
    before = columns(state)
    result = state.filter(preemptor(), ["m", "n"])
    assert result.passed == []
    assert sorted(api.deleted) == [("team-a", "a", "uid-a"), ("team-a", "b", "uid-b")]
    assert state.preemptions == 2
    assert same_capacity(before, columns(state))  # evicting is the kubelet's; the ledger still holds them
    state.check_invariants()
    state.flush_events()
    assert {name for _, name, reason, _ in api.events if reason == "Preempted"} == {"a", "b"}


def test_a_pod_of_two_slices_does_not_preempt_when_the_room_made_takes_only_one_of_them():
    """Evicting "low" frees GPU 0 for the first container; GPU 1 stays held by a pod that outranks the
    preemptor, so the second container fits nowhere. A check of the first slice alone would evict."""
    api = FakeApi()
    state = narrow_state(api, {"n": inventory(gpus=2)})
    bound(state, "low", "n", 0, 10, BIG)
    bound(state, "high", "n", 1, 1000, BIG)
    before = columns(state)
    result = state.filter(preemptor(), ["n"])
    assert result.passed == [] and "n" in result.failed
    assert api.deleted == [] and state.cache.nominations == {} and state.preemptions == 0
    assert state.preempt(preemptor(), {"n": ["uid-low"]}) == {}  # kube-scheduler's candidate: the same
    assert same_capacity(before, columns(state))
    state.check_invariants()


@pytest.mark.parametrize(
    ("priority", "deleted"), [(100, []), (200, []), (99, ["uid-x", "uid-y"])],
    ids=["equal", "higher", "one-lower"],
)  # fmt: skip
def test_only_pods_of_lower_priority_are_victims_of_a_pod_of_two_slices(priority, deleted):
    api = FakeApi()
    state = narrow_state(api, {"n": inventory(gpus=2)})
    bound(state, "x", "n", 0, priority, BIG)
    bound(state, "y", "n", 1, priority, BIG)
    state.filter(preemptor(priority=100), ["n"])
    assert sorted(uid for _, _, uid in api.deleted) == deleted
    kept = state.preempt(preemptor(priority=100), {"n": ["uid-x", "uid-y"]})
    assert kept == ({"n": ["uid-x", "uid-y"]} if deleted else {})
    state.check_invariants()


def test_the_preempt_verb_drops_a_candidate_whose_victims_free_the_wrong_gpus_for_the_second_slice():
    """kube-scheduler counts GPUs, not where their room is. On "a" two pods free both GPUs: kept as
    proposed. On "b" two 30000 MiB pods free all of GPU 0, room for one 60000 MiB slice but not two, and
    GPU 1 stays held: dropped, though GPU 0 alone has room for the first container's slice. On "c" the
    proposed pod frees one GPU, the other stays held: dropped."""
    api = FakeApi()
    state = narrow_state(api, {"a": inventory(gpus=2), "b": inventory(gpus=2), "c": inventory(gpus=2)})
    bound(state, "a0", "a", 0, 10, BIG)
    bound(state, "a1", "a", 1, 10, BIG)
    bound(state, "b0", "b", 0, 10, HALF)
    bound(state, "b1", "b", 0, 10, HALF)
    bound(state, "b-keep", "b", 1, 10, BIG)
    bound(state, "c0", "c", 0, 10, BIG)
    bound(state, "c-keep", "c", 1, 10, BIG)
    before = columns(state)
    candidates = {"a": ["uid-a0", "uid-a1"], "b": ["uid-b0", "uid-b1"], "c": ["uid-c0"]}
    assert state.preempt(preemptor(), candidates) == {"a": ["uid-a0", "uid-a1"]}
    assert same_capacity(before, columns(state))
    state.check_invariants()


def test_every_what_if_leaves_the_ledger_as_it_found_it_and_the_victims_still_release_cleanly(monkeypatch):
    """The what-if gives the victims' slices back and holds them again: after each one every column
    equals what it was, and a victim's end (a two-slice pod among them) frees exactly what it held."""
    api = FakeApi()
    state = narrow_state(api, {"n": inventory(gpus=2)})
    bound(state, "low", "n", 0, 10, HALF)
    bound_two_slices(state, "pair", "n", (0, 1), 20)
    bound(state, "high", "n", 1, 1000, HALF)
    before = columns(state)
    seen: list[bool] = []
    real = pod_slices.fits_without

    def checked(*args: Any) -> bool:
        answer = real(*args)
        state.check_invariants()
        assert same_capacity(before, columns(state))
        seen.append(answer)
        return answer

    monkeypatch.setattr(extender_preemption.pod_slices, "fits_without", checked)
    state.filter(preemptor(), ["n"])
    state.preempt(preemptor(), {"n": ["uid-low", "uid-pair"]})
    assert seen and not any(seen)  # "high" keeps 30000 MiB of GPU 1: never room for two 60000 MiB slices
    assert api.deleted == []
    for name, gpu in (("pair", "0"), ("low", "0"), ("high", "1")):
        state.apply(WatchEvent("Pod", "DELETED", _bound_pod(name, "n", gpu, BIG)))
    state.check_invariants()
    assert state.ledger.view.free_gpu_memory_bytes[0, :2].tolist() == [81920 * MiB] * 2


def test_the_room_a_pod_of_two_slices_made_is_held_for_it_until_it_binds_both():
    api = FakeApi()
    state = narrow_state(api, {"n": inventory(gpus=2)})
    bound(state, "x", "n", 0, 10, BIG)
    bound(state, "y", "n", 1, 10, BIG)
    pod = preemptor()
    state.filter(pod, ["n"])
    assert [h.uid for h in state.cache.nominations.values()] == ["uid-both"]
    for name, gpu in (("x", "0"), ("y", "1")):  # the kubelet ended the victims
        state.apply(WatchEvent("Pod", "DELETED", _bound_pod(name, "n", gpu, BIG)))
    sneaky = with_priority(pod_json("sneaky", BIG), 50)
    refused = state.filter(sneaky, ["n"])
    assert refused.passed == [] and refused.failed["n"] == REASON_RESERVED
    assert state.filter(pod, ["n"]).passed == ["n"]
    api.pods[("team-a", "both")] = pod
    assert state.bind("team-a", "both", "uid-both", "n") == ""
    assert state.cache.nominations == {}
    free = state.ledger.view.free_gpu_memory_bytes[0, :2].tolist()
    assert sorted(free) == [(81920 - 60000) * MiB] * 2  # one slice on each GPU
    state.check_invariants()


def test_a_ledger_rebuilt_between_filter_and_preemption_is_not_searched():
    """A node's inventory arriving rebuilds the ledger and moves the rows; the victims' slices are then
    the new build's. A search over the build filter read would give back slices it does not hold: the
    pod waits for its next filter, which preempts on the new build."""
    api = FakeApi()
    state = narrow_state(api, {"n": inventory(gpus=2)})
    bound(state, "x", "n", 0, 10, BIG)
    bound(state, "y", "n", 1, 10, BIG)
    pod = preemptor()
    old = state.cache.ledgered()
    state.apply(node_event("a", inventory(gpus=2)))  # sorts before "n": "n" moves from row 0 to row 1
    assert state.cache.ledgered() is not old
    waiting = state.preemption.make_room(pod, old, pod_ask(pod), ["n"], np.array([0]), np.array([CODE_GPU]))
    assert waiting == "" and api.deleted == []
    state.filter(pod, ["n"])
    assert sorted(uid for _, _, uid in api.deleted) == ["uid-x", "uid-y"]
    state.check_invariants()
