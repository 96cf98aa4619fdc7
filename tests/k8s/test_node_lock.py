"""The node lock: taken by the extender's bind, refused while held, released after Allocate, expired,
kept across an extender restart, and given back when a bind or an Allocate fails."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
from test_extender import GPU1_8G, FakeApi, inventory, node_event, pod_json

from gpuslice.k8s.annotations import ANNOTATION_BIND_PHASE, BIND_PHASE_ALLOCATED
from gpuslice.k8s.extender import ClusterState
from gpuslice.k8s.node_lock import (
    ANNOTATION_NODE_LOCK,
    LockHolder,
    NodeLockConflict,
    holders_text,
    parse_holders,
    release,
    take,
)

NODE = "a100-0"


class LockingApi(FakeApi):
    """The extender's fake API plus a Node with a resourceVersion (a stale write gets the 409), and pods
    read back with the annotations written to them."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.node: dict[str, str] = {}
        self.version = 1
        self.raced = 0  # writes still to be beaten by another writer (a Node change in between)

    def read_node_annotations(self, node_name: str) -> tuple[dict[str, str], str]:
        with self._lock:
            return dict(self.node), str(self.version)

    def write_node_annotations(
        self, node_name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> None:
        with self._lock:
            if self.raced:
                self.raced -= 1
                self.version += 1  # the kubelet's status update landed first
            if resource_version != str(self.version):
                raise NodeLockConflict("409 Conflict")
            for key, value in annotations.items():
                if value is None:
                    self.node.pop(key, None)
                else:
                    self.node[key] = value
            self.version += 1

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        pod = dict(self.pods[(namespace, name)])
        pod["metadata"] = {**pod["metadata"], "annotations": {**pod["metadata"]["annotations"]}}
        pod["metadata"]["annotations"].update(self.annotations_of(name))
        return pod

    def holder(self) -> LockHolder | None:
        return only_holder(self.node.get(ANNOTATION_NODE_LOCK))

    def allocated(self, name: str) -> None:
        """What the device plugin does after Allocate: mark the pod, release its lock."""
        self.patch_pod_annotations("team-a", name, {ANNOTATION_BIND_PHASE: BIND_PHASE_ALLOCATED})
        assert release(self, NODE, f"uid-{name}")


def only_holder(text: str | None) -> LockHolder | None:
    holders = parse_holders(text)
    assert len(holders) <= 1, holders
    return holders[0] if holders else None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def locking_state(api: LockingApi, wait_s: float = 0.0, timeout_s: float = 300.0) -> ClusterState:
    state = ClusterState(api, default_policy="bestfit", lock_timeout_s=timeout_s, lock_wait_s=wait_s)
    state.apply(node_event(NODE, inventory()))
    return state


def add(api: LockingApi, name: str) -> dict[str, Any]:
    pod = pod_json(name, GPU1_8G)
    api.pods[("team-a", name)] = pod
    return pod


def bind(state: ClusterState, name: str) -> str:
    return state.bind("team-a", name, f"uid-{name}", NODE)


# ---- the lock itself ---------------------------------------------------------------------------------


def test_take_writes_the_holder_and_a_second_pod_is_refused_while_it_lives():
    api, clock = LockingApi(), Clock()
    first, second = LockHolder("u1", "ns", "one", clock()), LockHolder("u2", "ns", "two", clock())
    assert take(api, NODE, first, timeout_s=300, alive=lambda h: True, now=clock) is None
    assert api.holder() == first
    assert take(api, NODE, second, timeout_s=300, alive=lambda h: True, now=clock) == first
    assert api.holder() == first
    assert take(api, NODE, first, timeout_s=300, alive=lambda h: True, now=clock) is None  # a retried bind


def test_an_expired_lock_or_one_whose_pod_no_longer_waits_is_taken_over():
    api, clock = LockingApi(), Clock()
    first, second = LockHolder("u1", "ns", "one", clock()), LockHolder("u2", "ns", "two", clock())
    take(api, NODE, first, timeout_s=300, alive=lambda h: True, now=clock)
    clock.now += 299
    assert take(api, NODE, second, timeout_s=300, alive=lambda h: True, now=clock) == first
    clock.now += 1
    assert take(api, NODE, second, timeout_s=300, alive=lambda h: True, now=clock) is None
    assert api.holder() == second
    third = LockHolder("u3", "ns", "three", clock())
    assert take(api, NODE, third, timeout_s=300, alive=lambda h: h.uid != "u2", now=clock) is None
    assert api.holder() == third


def test_release_clears_only_the_holders_lock():
    api = LockingApi()
    take(api, NODE, LockHolder("u1", "ns", "one", 0), timeout_s=300, alive=lambda h: True)
    api.node["other"] = "kept"
    assert not release(api, NODE, "u2")
    assert api.holder() is not None
    assert release(api, NODE, "u1")
    assert api.node == {"other": "kept"}
    assert not release(api, NODE, "u1")  # already free


def test_a_node_change_between_read_and_write_is_read_again_never_overwritten():
    """The write carries the resourceVersion read: a change in between (409) makes take read again
    and see the pod that locked the node meanwhile, instead of overwriting its lock."""
    api = LockingApi()
    api.raced = 2
    assert take(api, NODE, LockHolder("u1", "ns", "one", 0), timeout_s=300, alive=lambda h: True) is None
    assert api.holder().uid == "u1"

    class Sneaky(LockingApi):
        def read_node_annotations(self, node_name):
            seen = super().read_node_annotations(node_name)
            if ANNOTATION_NODE_LOCK not in self.node:  # another extender takes it right after our read
                self.node[ANNOTATION_NODE_LOCK] = holders_text([LockHolder("rival", "ns", "rival", 1000.0)])
                self.version += 1
            return seen

    sneaky = Sneaky()
    got = take(
        sneaky, NODE, LockHolder("u1", "ns", "one", 10.0), timeout_s=300, alive=lambda h: True, now=Clock()
    )
    assert got is not None and got.uid == "rival" and sneaky.holder().uid == "rival"


@pytest.mark.parametrize(
    "text", ["", "not json", "[]", '{"uid": 5, "pod": "a/b", "since": 1}', '{"uid": "u", "pod": "a/b"}',
             '{"uid": "u", "pod": "a/b", "since": NaN}', '{"uid": "u", "pod": "", "since": 1}', "[5]",
             '[{"uid": "u", "pod": "a/b", "since": 1, "key": 7}]', '[{"uid": "u"}]', '"text"', "null"],
)  # fmt: skip
def test_a_malformed_lock_is_free(text):
    api = LockingApi()
    api.node[ANNOTATION_NODE_LOCK] = text
    assert parse_holders(text) == ()
    assert take(api, NODE, LockHolder("u1", "ns", "one", 0), timeout_s=300, alive=lambda h: True) is None


def test_holders_of_different_allocate_keys_share_the_node_and_one_key_is_one_pod():
    api, clock = LockingApi(), Clock()
    share = LockHolder("u1", "ns", "share", clock(), "gpuslice.io/gpu*1")
    pair = LockHolder("u2", "ns", "pair", clock(), "gpuslice.io/gpu*2")
    mig = LockHolder("u3", "ns", "mig", clock(), "gpuslice.io/mig-1g.10gb*1")
    again = LockHolder("u4", "ns", "again", clock(), "gpuslice.io/gpu*1")
    for holder in (share, pair, mig):
        assert take(api, NODE, holder, timeout_s=300, alive=lambda h: True, now=clock) is None
    assert parse_holders(api.node[ANNOTATION_NODE_LOCK]) == (share, pair, mig)
    assert take(api, NODE, again, timeout_s=300, alive=lambda h: True, now=clock) == share
    assert release(api, NODE, "u1")
    assert parse_holders(api.node[ANNOTATION_NODE_LOCK]) == (pair, mig)  # the others' entries stay
    assert take(api, NODE, again, timeout_s=300, alive=lambda h: True, now=clock) is None
    for uid in ("u2", "u3", "u4"):
        assert release(api, NODE, uid)
    assert ANNOTATION_NODE_LOCK not in api.node


def test_an_entry_without_a_key_holds_the_whole_node_either_way():
    """The single object an older extender wrote locks every key, and a keyless holder waits for all."""
    api, clock = LockingApi(), Clock()
    api.node[ANNOTATION_NODE_LOCK] = '{"uid": "old", "pod": "ns/old", "since": 1000.0}'
    keyed = LockHolder("u1", "ns", "one", clock(), "gpuslice.io/gpu*2")
    assert take(api, NODE, keyed, timeout_s=300, alive=lambda h: True, now=clock).uid == "old"
    assert release(api, NODE, "old")
    assert take(api, NODE, keyed, timeout_s=300, alive=lambda h: True, now=clock) is None
    whole = LockHolder("u2", "ns", "two", clock())
    assert take(api, NODE, whole, timeout_s=300, alive=lambda h: True, now=clock) == keyed


def test_an_expired_entry_of_another_key_is_dropped_when_the_lock_is_taken():
    api, clock = LockingApi(), Clock()
    stale = LockHolder("u1", "ns", "stale", clock(), "gpuslice.io/gpu*2")
    take(api, NODE, stale, timeout_s=300, alive=lambda h: True, now=clock)
    clock.now += 301
    fresh = LockHolder("u2", "ns", "fresh", clock(), "gpuslice.io/gpu*1")
    assert take(api, NODE, fresh, timeout_s=300, alive=lambda h: True, now=clock) is None
    assert parse_holders(api.node[ANNOTATION_NODE_LOCK]) == (fresh,)


# ---- the extender's bind -----------------------------------------------------------------------------


def test_bind_takes_the_lock_and_a_second_bind_on_the_node_is_refused_until_allocate_releases_it():
    api = LockingApi()
    state = locking_state(api)
    add(api, "thirty"), add(api, "seventy")
    assert bind(state, "thirty") == ""
    holder = api.holder()
    assert (holder.uid, str(holder)) == ("uid-thirty", "team-a/thirty")
    refused = bind(state, "seventy")
    assert "node a100-0 is locked by pod team-a/thirty" in refused and "retries" in refused
    assert "allocate key gpuslice.io/gpu*1" in refused
    assert [b[1] for b in api.bindings] == ["thirty"]
    assert "seventy" not in {p[1] for p in api.patches}  # no decision written for the refused pod
    api.allocated("thirty")
    assert bind(state, "seventy") == ""
    assert api.holder().uid == "uid-seventy"
    state.check_invariants()


def test_a_share_pod_and_a_two_gpu_pod_bind_together_but_a_second_share_pod_waits():
    """The device plugin tells a 1-device Allocate call from a 2-device one, so the lock lets one pod
    of each through at once; a second 1-GPU pod still waits for the first one's Allocate."""
    api = LockingApi()
    state = locking_state(api)
    add(api, "share"), add(api, "share-2")
    api.pods[("team-a", "pair")] = pod_json("pair", {"gpuslice.io/gpu": "2"})
    assert bind(state, "share") == ""
    assert bind(state, "pair") == ""
    assert {(h.name, h.key) for h in parse_holders(api.node[ANNOTATION_NODE_LOCK])} == {
        ("share", "gpuslice.io/gpu*1"),
        ("pair", "gpuslice.io/gpu*2"),
    }
    refused = bind(state, "share-2")
    assert "locked by pod team-a/share," in refused and "(allocate key gpuslice.io/gpu*1)" in refused
    api.allocated("share")
    assert bind(state, "share-2") == ""
    state.check_invariants()


def test_a_bind_waiting_for_the_lock_goes_ahead_when_the_node_changes():
    api = LockingApi()
    state = locking_state(api, wait_s=60.0)
    add(api, "first"), add(api, "second")
    assert bind(state, "first") == ""
    result: list[str] = []
    waiter = threading.Thread(target=lambda: result.append(bind(state, "second")))
    waiter.start()
    api.allocated("first")
    state.apply(node_event(NODE, inventory()))  # the watch sees the release
    waiter.join(timeout=60)
    assert result == [""] and api.holder().uid == "uid-second"


def test_a_failed_binding_gives_the_lock_back():
    api = LockingApi(fail_binding=True)
    state = locking_state(api)
    add(api, "unlucky")
    assert "binding team-a/unlucky to a100-0 failed" in bind(state, "unlucky")
    assert api.holder() is None


def test_a_bind_that_no_longer_fits_gives_the_lock_back():
    api = LockingApi()
    state = locking_state(api)
    api.pods[("team-a", "huge")] = pod_json("huge", {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "90000"})
    assert "no longer fits" in bind(state, "huge")
    assert api.holder() is None


def test_a_restarted_extender_still_sees_the_lock_and_its_pod_waiting():
    api = LockingApi()
    add(api, "thirty"), add(api, "seventy")
    assert bind(locking_state(api), "thirty") == ""
    restarted = locking_state(api)
    assert "locked by pod team-a/thirty" in bind(restarted, "seventy")
    api.allocated("thirty")
    assert bind(restarted, "seventy") == ""


def test_a_lock_whose_pod_is_gone_or_allocated_without_release_is_taken_over():
    api = LockingApi()
    state = locking_state(api)
    add(api, "gone"), add(api, "next"), add(api, "after")
    assert bind(state, "gone") == ""
    del api.pods[("team-a", "gone")]
    api.gone.add("uid-gone")
    assert bind(state, "next") == ""  # deleted mid-start: the node is not wedged
    api.patch_pod_annotations("team-a", "next", {ANNOTATION_BIND_PHASE: BIND_PHASE_ALLOCATED})  # no release
    assert bind(state, "after") == ""
    assert api.holder().uid == "uid-after"


def test_a_lock_held_past_its_timeout_is_taken_over():
    api = LockingApi()
    state = locking_state(api, timeout_s=300.0)
    clock = Clock()
    assert state.bind_locks is not None
    state.bind_locks._now = clock
    add(api, "stuck"), add(api, "next")
    assert bind(state, "stuck") == ""
    clock.now += 299.0
    assert "locked by pod team-a/stuck" in bind(state, "next")
    clock.now += 1.0
    assert bind(state, "next") == ""
    assert api.holder().uid == "uid-next"


def test_pods_without_gpus_bind_without_the_lock():
    api = LockingApi()
    state = locking_state(api)
    add(api, "thirty")
    assert bind(state, "thirty") == ""
    api.pods[("team-a", "cpu")] = pod_json("cpu", {"cpu": "1"})
    assert bind(state, "cpu") == ""
    assert api.holder().uid == "uid-thirty"


def test_a_retried_bind_of_a_bound_pod_keeps_its_decision_and_its_lock():
    """kube-scheduler retries a bind that timed out though it succeeded (filter, then bind again): the
    retry must neither choose GPUs again nor overwrite the decision the kubelet will allocate by."""
    api = LockingApi()
    state = locking_state(api)
    state.narrow = True  # filter holds the chosen node's GPUs (as the CLI's --decide does)
    pod = add(api, "slow")
    assert state.filter(pod, [NODE]).passed == [NODE]
    assert bind(state, "slow") == ""
    patches, held = len(api.patches), state.cache.pods["uid-slow"]
    assert state.filter(pod, [NODE]).passed == [NODE]  # the retry's filter
    assert state.cache.pods["uid-slow"] is held  # not given back and reserved again
    assert bind(state, "slow") == ""
    assert len(api.patches) == patches and len(api.bindings) == 1
    assert api.holder().uid == "uid-slow"
    assert "already bound to a100-0" in state.bind("team-a", "slow", "uid-slow", "a100-1")
    state.check_invariants()
    assert int(state.ledger.view.gpu_tasks[0].sum()) == 1  # held once
