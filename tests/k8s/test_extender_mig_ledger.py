"""The extender holds bound MIG pods' instances in its ledger: rebuilt from their decisions, conflicts
refused and counted, instances given back when pods go."""

from __future__ import annotations

from test_extender import FakeApi, inventory, make_state, node_event, pod_json

from gpuslice.k8s.annotations import (
    MigSlot,
)
from gpuslice.k8s.decision import Decision, MigChoice
from gpuslice.k8s.extender import WatchEvent

RESOURCES = {"gpuslice.io/mig-3g.40gb": "1"}
SLOTS = {1: (MigSlot("3g.40gb", 0, "MIG-a", 1), MigSlot("3g.40gb", 4, "MIG-b", 2))}


def bound(name: str, start: int, profile: str = "3g.40gb") -> WatchEvent:
    mig = MigChoice(1, profile, start, f"MIG-{start}")
    decision = Decision("n", "train", (1,), ("GPU-A100-80GB-01",), 0, 100, mig)
    return WatchEvent("Pod", "ADDED", pod_json(name, RESOURCES, decision.to_annotations(), node="n"))


def held_starts(state) -> list[int]:
    layout = state.ledger.mig_layout(0, 1)
    return sorted(i.start for i in layout.instances)


def test_bound_mig_pods_are_held_in_the_ledger_and_a_second_claim_on_one_instance_is_a_conflict():
    state = make_state(FakeApi(), {"n": inventory(gpus=2, mig=SLOTS)})
    state.apply(bound("one", 0))
    state.apply(bound("two", 0))  # the same instance: the ledger refuses it
    state.apply(bound("odd", 4, profile="9g.99gb"))  # no such profile on an A100: refused too
    assert held_starts(state) == [0]  # the ledger is built from the pods' decisions on first use
    assert state.conflicts == 2
    state.check_invariants()
    # the next pod gets the other instance; then none is left
    assert state.filter(pod_json("new", RESOURCES), ["n"]).passed == ["n"]
    assert state.bind("team-a", "new", "uid-new", "n") == ""
    assert held_starts(state) == [0, 4]
    assert state.filter(pod_json("late", RESOURCES), ["n"]).passed == []
    # a pod that goes gives its instance back
    state.apply(WatchEvent("Pod", "DELETED", pod_json("one", RESOURCES, node="n")))
    assert held_starts(state) == [4]
    state.check_invariants()


def test_a_rebuild_holds_the_bound_mig_pods_again_from_their_decisions():
    state = make_state(FakeApi(), {"n": inventory(gpus=2, mig=SLOTS)})
    state.apply(bound("one", 4))
    assert held_starts(state) == [4]
    state.apply(node_event("n", inventory(gpus=3, mig=SLOTS), kind="MODIFIED"))  # a new inventory
    assert state.ledger.node_count == 1 and state.ledger.view.gpu_count[0] == 3
    assert held_starts(state) == [4]
    assert state.conflicts == 0
    state.check_invariants()


def test_a_higher_priority_mig_pod_evicts_the_least_important_holder_of_an_instance_of_its_profile():
    """The extender's own preemption for a MIG pod: the what-if gives the victims' instances back in the
    ledger's layout (``ClusterCache.mig_candidates(..., freed)``), through the one preemption search."""
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=2, mig=SLOTS)})
    for name, start, priority in (("keep", 0, 50), ("low", 4, 1)):
        event = bound(name, start)
        event.object["spec"]["priority"] = priority  # type: ignore[index]
        state.apply(event)
    assert held_starts(state) == [0, 4]
    high = pod_json("high", RESOURCES)
    high["spec"]["priority"] = 100
    assert state.filter(high, ["n"]).passed == []
    assert api.deleted == [("team-a", "low", "uid-low")]  # one instance is enough: the least important
    mid = pod_json("mid", RESOURCES)
    mid["spec"]["priority"] = 40  # below "keep" (50); "low" is going already
    state.filter(mid, ["n"])
    assert api.deleted == [("team-a", "low", "uid-low")]  # "keep" is never a victim of 40


def test_mig_verdicts_are_rebuilt_only_for_the_nodes_a_bind_changed(monkeypatch):
    """A MIG pod's filter and prioritize read each node's best instance from a cache kept at the row's
    ledger version: after a bind on one node of five, only that node's candidates are built again."""
    names = [f"n{i}" for i in range(5)]
    state = make_state(FakeApi(), {n: inventory(gpus=2, mig=SLOTS) for n in names})
    built_for: list[int] = []
    original = type(state.cache).mig_candidates

    def counting(self, built, node, profile, freed=()):
        built_for.append(node)
        return original(self, built, node, profile, freed)

    monkeypatch.setattr(type(state.cache), "mig_candidates", counting)
    assert state.filter(pod_json("a", RESOURCES), names).passed == names
    assert sorted(built_for) == [0, 1, 2, 3, 4]
    built_for.clear()
    state.prioritize(pod_json("a", RESOURCES), names)
    assert built_for == []  # the filter's answers, still current
    assert state.bind("team-a", "a", "uid-a", "n2") == ""
    built_for.clear()
    scores = dict(state.prioritize(pod_json("b", RESOURCES), names))
    assert built_for == [2]  # only the bound node's row moved
    assert scores["n2"] == max(scores.values())  # and it now holds an instance: the fullest GPU


def test_deciding_a_mig_pod_passes_the_node_of_the_fullest_gpu_with_a_free_instance_first_on_a_tie():
    """--decide for a MIG pod: the one MIG choice over the offered nodes (the fullest GPU that has a free
    instance of the profile, the first node in order on a tie), the node that holds it passed alone."""
    api = FakeApi()
    state = make_state(api, {n: inventory(gpus=2, mig=SLOTS) for n in ("a", "b", "c")})
    state.narrow = True
    first = state.filter(pod_json("p0", RESOURCES), ["c", "b", "a"])
    assert first.passed == ["c"]  # every GPU as empty: the first node offered
    assert first.failed == {"b": "gpuslice (bestfit) chose c", "a": "gpuslice (bestfit) chose c"}
    api.pods[("team-a", "p0")] = pod_json("p0", RESOURCES)
    assert state.bind("team-a", "p0", "uid-p0", "c") == ""
    second = state.filter(pod_json("p1", RESOURCES), ["a", "b", "c"])
    assert second.passed == ["c"]  # c's GPU holds one instance now: the fullest with a free one
    api.pods[("team-a", "p1")] = pod_json("p1", RESOURCES)
    assert state.bind("team-a", "p1", "uid-p1", "c") == ""
    third = state.filter(pod_json("p2", RESOURCES), ["c", "b", "a"])
    assert third.passed == ["b"] and "no free MIG instance" in third.failed["c"]
    starts = set()
    for name in ("p0", "p1"):
        decision = Decision.from_annotations(api.annotations_of(name))
        assert decision is not None and decision.mig is not None and decision.node == "c"
        starts.add(decision.mig.start)
    assert starts == {0, 4}
    state.check_invariants()
