"""Two or more binds of one pod at once: kube-scheduler retries a bind after its httpTimeout while the
first is still running here. The API server binds a pod once and answers every later Binding with 409
("already assigned"). Whatever the interleaving, exactly one decision survives: the pod's annotations
name the node it is bound to, nothing marks it failed, and the ledger holds it once, on that node, so
no other whole-GPU pod is placed on its GPU."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from test_extender import inventory, node_event, pod_json
from test_node_lock import LockingApi

from gpuslice.k8s.annotations import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_NODE,
    BIND_PHASE_ALLOCATED,
    BIND_PHASE_FAILED,
)
from gpuslice.k8s.extender import ClusterState
from gpuslice.k8s.extender.kube import AlreadyBound
from gpuslice.k8s.node_lock import ANNOTATION_NODE_LOCK, LockHolder, NodeLockConflict, parse_holders, release

WHOLE = {"gpuslice.io/gpu": "1"}
NODES = ("n0", "n1")


class BindingApi(LockingApi):
    """The API server's Binding rule: the first Binding of a pod wins, later ones get 409 Conflict; every
    call takes ``delay_s`` so that concurrent binds overlap."""

    def __init__(self, delay_s: float = 0.005) -> None:
        super().__init__(delay_s=delay_s)
        self.node_of: dict[str, str] = {}  # pod uid -> node of its Binding
        self.nodes: dict[str, tuple[dict[str, str], int]] = {n: ({}, 1) for n in NODES}

    def read_node_annotations(self, node_name: str) -> tuple[dict[str, str], str]:
        time.sleep(self.delay_s)
        with self._lock:
            annotations, version = self.nodes[node_name]
            return dict(annotations), str(version)

    def write_node_annotations(
        self, node_name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> None:
        time.sleep(self.delay_s)
        with self._lock:
            current, version = self.nodes[node_name]
            if resource_version != str(version):
                raise NodeLockConflict("409 Conflict")
            merged = {**current, **{k: v for k, v in annotations.items() if v is not None}}
            for key in [k for k, v in annotations.items() if v is None]:
                merged.pop(key, None)
            self.nodes[node_name] = (merged, version + 1)

    def lock_of(self, node_name: str) -> LockHolder | None:
        holders = parse_holders(self.nodes[node_name][0].get(ANNOTATION_NODE_LOCK))
        assert len(holders) <= 1, holders  # these pods all have one allocate key
        return holders[0] if holders else None

    def allocate(self, name: str, node_name: str) -> None:
        """What the device plugin does after Allocate: mark the pod, release its node lock."""
        self.patch_pod_annotations("team-a", name, {ANNOTATION_BIND_PHASE: BIND_PHASE_ALLOCATED})
        assert release(self, node_name, f"uid-{name}")

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        time.sleep(self.delay_s)
        with self._lock:
            if uid in self.node_of:
                raise AlreadyBound(
                    f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                    f"assigned to node {self.node_of[uid]!r}"
                )
            self.node_of[uid] = node
            self.bindings.append((namespace, name, uid, node))

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        pod = dict(super().get_pod(namespace, name))
        uid = pod["metadata"]["uid"]
        if uid in self.node_of:
            pod["spec"] = {**pod["spec"], "nodeName": self.node_of[uid]}
        return pod


def _state(api: BindingApi) -> ClusterState:
    state = ClusterState(api, default_policy="bestfit", lock_timeout_s=300.0, lock_wait_s=0.5)
    for name in NODES:
        state.apply(node_event(name, inventory(gpus=1)))
    return state


def _race(state: ClusterState, api: BindingApi, name: str, targets: list[str]) -> list[str]:
    """Bind pod ``name`` once per target, all at once; the answers in target order."""
    pod = pod_json(name, WHOLE)
    api.pods[("team-a", name)] = pod
    answers = [""] * len(targets)
    start = threading.Barrier(len(targets))

    def bind(i: int) -> None:
        start.wait()
        answers[i] = state.bind("team-a", name, f"uid-{name}", targets[i])

    threads = [threading.Thread(target=bind, args=(i,)) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def _one_decision(state: ClusterState, api: BindingApi, name: str) -> str:
    """The checks every race must pass; the node the pod is bound to."""
    uid = f"uid-{name}"
    assert [b[2] for b in api.bindings].count(uid) == 1
    node = api.node_of[uid]
    written = api.annotations_of(name)
    assert written[ANNOTATION_NODE] == node, f"annotations name {written[ANNOTATION_NODE]}, bound to {node}"
    assert written[ANNOTATION_BIND_PHASE] != BIND_PHASE_FAILED
    ledger = state.ledger
    held = {n: int(ledger.view.gpu_tasks[ledger.node_names.index(n)].sum()) for n in NODES}
    assert held == {n: int(n == node) for n in NODES}, f"ledger holds {held}, pod bound to {node}"
    state.check_invariants()
    return node


def test_two_binds_of_one_pod_on_two_nodes_leave_one_decision_every_time():
    for trial in range(50):
        api = BindingApi()
        state = _state(api)
        answers = _race(state, api, "p", list(NODES))
        node = _one_decision(state, api, "p")
        assert answers[NODES.index(node)] == "", (trial, answers)


def test_two_binds_of_one_pod_on_one_node_leave_one_decision_every_time():
    for trial in range(50):
        api = BindingApi()
        state = _state(api)
        answers = _race(state, api, "p", ["n0", "n0"])
        assert _one_decision(state, api, "p") == "n0"
        assert "" in answers, (trial, answers)


def test_an_eight_way_race_never_frees_the_winners_gpu():
    """Eight binds of one pod over both nodes, then more whole-GPU pods: the winner's node takes none."""
    for _ in range(10):
        api = BindingApi()
        state = _state(api)
        _race(state, api, "p", [NODES[i % 2] for i in range(8)])
        node = _one_decision(state, api, "p")
        api.allocate("p", node)  # the node lock is free again: only the ledger stands in the way
        for i in range(3):
            name = f"late{i}"
            api.pods[("team-a", name)] = pod_json(name, WHOLE)
            error = state.bind("team-a", name, f"uid-{name}", node)
            assert "no longer fits" in error, f"{name} on {node} (the raced pod's only GPU): {error!r}"
        state.check_invariants()


def test_a_409_already_assigned_keeps_the_hold_and_writes_nothing_more():
    """The pod was bound by someone this extender does not know about (an earlier attempt whose answer
    was lost): the 409 leaves the decision just written and its hold, and says where the pod is."""
    api = BindingApi(delay_s=0.0)
    state = _state(api)
    api.pods[("team-a", "p")] = pod_json("p", WHOLE)
    api.node_of["uid-p"] = "n0"  # bound already, behind this extender's back
    error = state.bind("team-a", "p", "uid-p", "n0")
    assert error == ""  # bound where it was asked to go: the decision written stands
    patches = [a for _, n, a in api.patches if n == "p"]
    assert all(a.get(ANNOTATION_BIND_PHASE) != BIND_PHASE_FAILED for a in patches)
    assert int(state.ledger.view.gpu_tasks[state.ledger.node_names.index("n0")].sum()) == 1
    # the pod's node lock stays with it until Allocate (the device plugin releases it)
    holder = api.lock_of("n0")
    assert holder is not None and holder.uid == "uid-p"
