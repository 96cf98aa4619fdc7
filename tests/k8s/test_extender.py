"""The scheduler extender over HTTP: the exact JSON kube-scheduler posts, and what comes back.

Bodies follow k8s.io/kube-scheduler extender/v1: PascalCase keys, ``NodeNames`` because the
extender is nodeCacheCapable, the pod as API JSON. The Kubernetes API is a fake that records calls.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import pytest

with warnings.catch_warnings():
    # starlette asks for its httpx2 fork at import; the httpx we have serves these tests the same.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from gpuslice.k8s.annotations import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_EXCLUDE_GPU_MODELS,
    ANNOTATION_GPU_INDICES,
    ANNOTATION_GPU_MODELS,
    ANNOTATION_GPU_UUIDS,
    ANNOTATION_GPUCORES,
    ANNOTATION_GPUMEM_MIB,
    ANNOTATION_MIG_INSTANCE,
    ANNOTATION_NODE,
    ANNOTATION_NODE_INVENTORY,
    ANNOTATION_PLACEMENT_POLICY,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_FAILED,
    InventoryGpu,
    MigSlot,
    NodeInventory,
)
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.extender import (
    REASON_NO_INVENTORY,
    REASON_NO_MIG_INSTANCE,
    REASON_SHARE_LIMIT,
    RELISTED,
    ClusterState,
    WatchEvent,
    create_app,
)
from gpuslice.policies import PLACEMENT

# ---- fakes and builders (also used by test_extender_property.py) --------------------------------------


class FakeApi:
    """Records every API call; ``delay_s`` makes each call slow, ``fail_binding`` makes bindings fail."""

    def __init__(self, delay_s: float = 0.0, fail_binding: bool = False) -> None:
        self.delay_s = delay_s
        self.fail_binding = fail_binding
        self.pods: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.patches: list[tuple[str, str, dict[str, str]]] = []
        self.bindings: list[tuple[str, str, str, str]] = []
        self.events: list[tuple[str, str, str, str]] = []
        self.deleted: list[tuple[str, str, str]] = []
        self.gone: set[str] = set()  # UIDs the API server no longer has (its watch may not have said so)
        self._lock = threading.Lock()

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.pods[(namespace, name)]

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        time.sleep(self.delay_s)
        with self._lock:
            self.patches.append((namespace, name, dict(annotations)))

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        time.sleep(self.delay_s)
        if self.fail_binding:
            raise RuntimeError("409 Conflict: pod is already assigned to a node")
        with self._lock:
            self.bindings.append((namespace, name, uid, node))

    def create_event(self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str) -> None:
        with self._lock:
            self.events.append((namespace, pod_name, reason, message))

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        with self._lock:
            self.deleted.append((namespace, name, uid))

    def pod_gone(self, namespace: str, name: str, uid: str) -> bool:
        return uid in self.gone

    def annotations_of(self, name: str) -> dict[str, str]:
        merged: dict[str, str] = {}
        for _, pod_name, written in self.patches:
            if pod_name == name:
                merged.update(written)
        return merged


def inventory(model: str = "A100-80GB", gpus: int = 8, memory_mib: int = 81920, split: int = 10, **kw: Any):
    return NodeInventory(
        gpus=tuple(
            InventoryGpu(i, f"GPU-{model}-{i:02d}", model, memory_mib, mig=kw.get("mig", {}).get(i, ()))
            for i in range(gpus)
        ),
        topology=kw.get("topology", ()),
        split_count=split,
    )


def node_event(name: str, inv: NodeInventory | None, kind: str = "ADDED", **extra: str) -> WatchEvent:
    annotations = {ANNOTATION_NODE_INVENTORY: inv.to_json()} if inv is not None else {}
    annotations.update(extra)
    return WatchEvent("Node", kind, {"metadata": {"name": name, "annotations": annotations}})


def pod_json(
    name: str,
    resources: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    namespace: str = "team-a",
    node: str = "",
) -> dict[str, Any]:
    """A pod as kube-scheduler serialises it inside ExtenderArgs."""
    spec: dict[str, Any] = {
        "schedulerName": "gpuslice-scheduler",
        "containers": [
            {
                "name": "train",
                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "resources": {"limits": dict(resources), "requests": dict(resources)},
            },
            {"name": "log-shipper", "image": "fluent-bit:3", "resources": {"requests": {"cpu": "100m"}}},
        ],
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": dict(annotations or {}),
            "creationTimestamp": "2025-06-01T10:00:00Z",
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def args(pod: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """ExtenderArgs as a nodeCacheCapable extender receives them: Nodes null, NodeNames set."""
    return {"Pod": pod, "Nodes": None, "NodeNames": list(names)}


def binding(pod: Mapping[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


def make_state(
    api: FakeApi, nodes: Mapping[str, NodeInventory | None], policy: str = "bestfit"
) -> ClusterState:
    state = ClusterState(api, default_policy=policy)
    for name, inv in nodes.items():
        state.apply(node_event(name, inv))
    return state


def client_for(state: ClusterState) -> httpx.Client:
    """httpx over the ASGI app in-process (no socket), with the app's startup and shutdown."""
    return TestClient(create_app(state))


GPU1_8G = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "8000", "gpuslice.io/gpucores": "30"}


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def cluster(api: FakeApi) -> ClusterState:
    """a100-0 and a100-1 (8 x A100-80GB), h100-0 (8 x H100, 2 shares per GPU), small-t4 (1 x T4),
    cpu-0 (no inventory annotation)."""
    return make_state(
        api,
        {
            "a100-0": inventory(),
            "a100-1": inventory(),
            "h100-0": inventory("H100", memory_mib=81559, split=2),
            "small-t4": inventory("T4", gpus=1, memory_mib=15109),
            "cpu-0": None,
        },
    )


ALL = ["a100-0", "a100-1", "h100-0", "small-t4", "cpu-0"]


# ---- filter -------------------------------------------------------------------------------------------


def test_filter_passes_nodes_with_room_and_gives_each_failed_node_its_reason(cluster):
    pod = pod_json("big", {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "40000"})
    with client_for(cluster) as http:
        reply = http.post("/filter", json=args(pod, ALL)).json()
    assert set(reply) == {"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert reply["Error"] == ""
    assert reply["NodeNames"] == ["a100-0", "a100-1", "h100-0"]
    assert reply["FailedNodes"] == {
        "small-t4": "insufficient free GPU memory: need 1 GPU(s) with 1 milli-GPU and 40000 MiB free"
    }
    assert reply["FailedAndUnresolvableNodes"] == {"cpu-0": REASON_NO_INVENTORY}


def test_filter_reports_an_excluded_model_as_unresolvable(cluster):
    pod = pod_json("no-t4", GPU1_8G, {ANNOTATION_EXCLUDE_GPU_MODELS: "T4,H100"})
    with client_for(cluster) as http:
        reply = http.post("/filter", json=args(pod, ["a100-0", "h100-0", "small-t4"])).json()
    assert reply["NodeNames"] == ["a100-0"]
    assert reply["FailedNodes"] == {}
    reasons = reply["FailedAndUnresolvableNodes"]
    assert set(reasons) == {"h100-0", "small-t4"}
    assert reasons["h100-0"].startswith("GPU model not allowed: pod excludes H100|T4")


def test_filter_with_pinned_model_keeps_only_that_model(cluster):
    pod = pod_json("on-h100", GPU1_8G, {ANNOTATION_GPU_MODELS: "H100"})
    with client_for(cluster) as http:
        reply = http.post("/filter", json=args(pod, ALL)).json()
    assert reply["NodeNames"] == ["h100-0"]


def test_filter_refuses_a_gpu_whose_share_limit_is_reached(api):
    state = make_state(api, {"t4": inventory("T4", gpus=1, memory_mib=15109, split=2)})
    small = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "1000", "gpuslice.io/gpucores": "10"}
    with client_for(state) as http:
        for i in range(2):
            pod = pod_json(f"p{i}", small)
            api.pods[("team-a", f"p{i}")] = pod
            assert http.post("/bind", json=binding(pod, "t4")).json() == {"Error": ""}
        reply = http.post("/filter", json=args(pod_json("p2", small), ["t4"])).json()
    assert reply["NodeNames"] == []
    assert reply["FailedNodes"]["t4"].startswith(REASON_SHARE_LIMIT)


def test_filter_accepts_legacy_lowercase_keys(cluster):
    pod = pod_json("legacy", GPU1_8G)
    with client_for(cluster) as http:
        reply = http.post("/filter", json={"pod": pod, "nodenames": ["a100-0", "cpu-0"]}).json()
    assert reply["NodeNames"] == ["a100-0"]


def test_filter_answers_a_malformed_node_list_with_an_error(cluster):
    with client_for(cluster) as http:
        reply = http.post("/filter", json={"Pod": pod_json("p", GPU1_8G), "NodeNames": ["a100-0", 7]}).json()
        scores = http.post("/prioritize", json={"Pod": pod_json("p", GPU1_8G), "NodeNames": [7]}).json()
    assert reply["NodeNames"] is None
    assert "NodeNames must be a list of node names" in reply["Error"]
    assert scores == []  # a prioritize error costs only this extender's scores


def test_filter_passes_every_node_for_a_pod_without_gpuslice_resources(cluster):
    pod = pod_json("cpu-job", {"cpu": "2"})
    with client_for(cluster) as http:
        reply = http.post("/filter", json=args(pod, ALL)).json()
    assert reply["NodeNames"] == ALL


def test_filter_rejects_an_invalid_request_on_every_node_with_the_reason(cluster):
    pod = pod_json("bad", {"gpuslice.io/gpu": "2", "gpuslice.io/gpucores": "50"})
    with client_for(cluster) as http:
        reply = http.post("/filter", json=args(pod, ["a100-0", "h100-0"])).json()
    assert reply["NodeNames"] == []
    assert all(
        "a share of a GPU is for one GPU only" in r for r in reply["FailedAndUnresolvableNodes"].values()
    )


def test_filter_rejects_an_unknown_policy_annotation_listing_the_known_ones(cluster):
    pod = pod_json("typo", GPU1_8G, {ANNOTATION_PLACEMENT_POLICY: "fdg"})
    with client_for(cluster) as http:
        reply = http.post("/filter", json=args(pod, ["a100-0"])).json()
    reason = reply["FailedAndUnresolvableNodes"]["a100-0"]
    assert "'fdg' is not a placement policy" in reason
    assert "bestfit" in reason


def test_pending_pod_gets_one_event_that_says_why(cluster, api):
    pod = pod_json("huge", {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "200000"})
    with client_for(cluster) as http:
        for _ in range(3):  # kube-scheduler retries; the event is not repeated within a minute
            http.post("/filter", json=args(pod, ALL))
    cluster.flush_events()
    assert len(api.events) == 1
    namespace, name, reason, message = api.events[0]
    assert (namespace, name, reason) == ("team-a", "huge", "FailedScheduling")
    assert message.startswith("gpuslice: 0/5 nodes fit: 4 insufficient free GPU memory")
    assert f"1 {REASON_NO_INVENTORY}" in message
    assert message.endswith("; closest: a100-0 (need 195.3 GiB, free 80 GiB of 80 GiB GPU memory)")


# ---- prioritize ---------------------------------------------------------------------------------------


def test_prioritize_returns_host_priority_list_scored_0_to_10(cluster, api):
    first = pod_json("first", GPU1_8G)
    api.pods[("team-a", "first")] = first
    with client_for(cluster) as http:
        assert http.post("/bind", json=binding(first, "a100-1")).json() == {"Error": ""}
        reply = http.post("/prioritize", json=args(pod_json("second", GPU1_8G), ["a100-0", "a100-1"])).json()
    assert reply == [{"Host": "a100-0", "Score": 0}, {"Host": "a100-1", "Score": 10}]  # bestfit packs


def test_prioritize_gives_zero_to_nodes_that_cannot_take_the_pod(cluster):
    pod = pod_json("big", {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "40000"})
    with client_for(cluster) as http:
        reply = http.post("/prioritize", json=args(pod, ["small-t4", "a100-0", "cpu-0"])).json()
    scores = {h["Host"]: h["Score"] for h in reply}
    assert scores == {"small-t4": 0, "a100-0": 10, "cpu-0": 0}
    assert all(0 <= h["Score"] <= 10 for h in reply)


@pytest.mark.parametrize("policy", sorted(PLACEMENT))
def test_prioritize_honours_the_policy_annotation(cluster, policy):
    pod = pod_json("p", GPU1_8G, {ANNOTATION_PLACEMENT_POLICY: policy})
    with client_for(cluster) as http:
        reply = http.post("/prioritize", json=args(pod, ["a100-0", "h100-0"])).json()
    assert [h["Host"] for h in reply] == ["a100-0", "h100-0"]
    assert all(0 <= h["Score"] <= 10 for h in reply)


# ---- cached verdicts: what filter computed is reused, and never outlives a change ---------------------

WHOLE = {"gpuslice.io/gpu": "1"}
NO_WHOLE_GPU = "insufficient free GPU: need 1 GPU(s) with 1000 milli-GPU"


def _bind(state: ClusterState, api: FakeApi, name: str, node: str, resources: Mapping[str, str]) -> None:
    pod = pod_json(name, resources)
    api.pods[("team-a", name)] = pod
    assert state.bind("team-a", name, f"uid-{name}", node) == ""


def test_a_bind_refreshes_the_cached_verdict_of_its_node(api):
    state = make_state(api, {"n": inventory(gpus=1), "m": inventory(gpus=1)})
    assert state.filter(pod_json("probe", WHOLE), ["n", "m"]).passed == ["n", "m"]  # cached for the shape
    _bind(state, api, "first", "n", WHOLE)
    result = state.filter(pod_json("next", WHOLE), ["n", "m"])
    assert result.passed == ["m"]
    assert result.failed == {"n": NO_WHOLE_GPU}
    state.check_invariants()


def test_a_deleted_pod_frees_its_node_for_the_cached_shape(api):
    state = make_state(api, {"n": inventory(gpus=1)})
    _bind(state, api, "first", "n", WHOLE)
    assert state.filter(pod_json("probe", WHOLE), ["n"]).passed == []  # the refusal is cached
    state.apply(WatchEvent("Pod", "DELETED", api.pods[("team-a", "first")]))
    assert state.filter(pod_json("next", WHOLE), ["n"]).passed == ["n"]
    state.check_invariants()


def test_a_pod_bound_elsewhere_fills_the_cached_node(api):
    state = make_state(api, {"n": inventory(gpus=1)})
    assert state.filter(pod_json("probe", WHOLE), ["n"]).passed == ["n"]
    state.apply(WatchEvent("Pod", "ADDED", _bound_pod("by-another", "n", "0", WHOLE)))
    assert state.filter(pod_json("next", WHOLE), ["n"]).failed == {"n": NO_WHOLE_GPU}


def test_a_failed_binding_gives_the_node_back_to_the_cached_shape(api):
    state = make_state(api, {"n": inventory(gpus=1)})
    assert state.filter(pod_json("probe", WHOLE), ["n"]).passed == ["n"]
    api.fail_binding = True
    api.pods[("team-a", "unlucky")] = pod_json("unlucky", WHOLE)
    assert "409 Conflict" in state.bind("team-a", "unlucky", "uid-unlucky", "n")
    assert state.filter(pod_json("next", WHOLE), ["n"]).passed == ["n"]
    state.check_invariants()


def test_an_inventory_change_replaces_the_cached_verdicts(api):
    state = make_state(api, {"n": inventory(gpus=1)})
    assert state.filter(pod_json("probe", WHOLE), ["n"]).passed == ["n"]
    sick = NodeInventory(gpus=(InventoryGpu(0, "GPU-0", "A100-80GB", 81920, healthy=False),), split_count=10)
    state.apply(node_event("n", sick, kind="MODIFIED"))
    assert state.filter(pod_json("next", WHOLE), ["n"]).passed == []
    state.apply(node_event("n", inventory(gpus=1), kind="MODIFIED"))
    assert state.filter(pod_json("later", WHOLE), ["n"]).passed == ["n"]


def test_prioritize_scores_the_names_it_is_sent_not_the_ones_filter_passed(api):
    state = make_state(api, {"a": inventory(), "b": inventory(), "c": inventory()})
    _bind(state, api, "used", "a", GPU1_8G)
    pod = pod_json("p", GPU1_8G)
    with client_for(state) as http:
        passed = http.post("/filter", json=args(pod, ["a", "b", "c"])).json()["NodeNames"]
        assert passed == ["a", "b", "c"]
        reply = http.post("/prioritize", json=args(pod, ["c", "a"])).json()
    assert reply == [{"Host": "c", "Score": 0}, {"Host": "a", "Score": 10}]  # bestfit packs onto a


def test_prioritize_sees_a_bind_made_after_the_pods_filter(api):
    state = make_state(api, {"a": inventory(), "b": inventory()})
    pod = pod_json("p", GPU1_8G)
    with client_for(state) as http:
        passed = http.post("/filter", json=args(pod, ["a", "b"])).json()["NodeNames"]
        _bind(state, api, "meanwhile", "b", GPU1_8G)
        reply = http.post("/prioritize", json=args(pod, passed)).json()
    assert reply == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 10}]


def test_prioritize_after_a_rebuild_does_not_reuse_the_old_indices(api):
    state = make_state(api, {"b": inventory(), "c": inventory()})
    _bind(state, api, "used", "c", GPU1_8G)
    pod = pod_json("p", GPU1_8G)
    with client_for(state) as http:
        passed = http.post("/filter", json=args(pod, ["b", "c"])).json()["NodeNames"]
        state.apply(node_event("a", inventory()))  # sorts first: every ledger index moves
        reply = http.post("/prioritize", json=args(pod, passed)).json()
    assert reply == [{"Host": "b", "Score": 0}, {"Host": "c", "Score": 10}]


def test_prioritize_gives_zero_to_a_node_whose_shares_are_all_taken(api):
    state = make_state(api, {"full": inventory(gpus=1, split=1), "free": inventory(gpus=1)})
    small = {"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "10"}
    _bind(state, api, "only", "full", small)  # 900 milli-GPU left, but no share slot
    reply = state.prioritize(pod_json("p", small), ["full", "free"])
    assert reply == [("full", 0), ("free", 10)]


# ---- bind ---------------------------------------------------------------------------------------------


def test_bind_writes_the_gpu_decision_then_creates_the_binding(cluster, api):
    pod = pod_json("share", GPU1_8G)
    api.pods[("team-a", "share")] = pod
    with client_for(cluster) as http:
        http.post("/filter", json=args(pod, ALL))
        reply = http.post("/bind", json=binding(pod, "a100-0")).json()
    assert reply == {"Error": ""}
    assert api.bindings == [("team-a", "share", "uid-share", "a100-0")]
    written = api.annotations_of("share")
    assert written[ANNOTATION_NODE] == "a100-0"
    assert written[ANNOTATION_GPU_INDICES] == "0"
    assert written[ANNOTATION_GPU_UUIDS] == "GPU-A100-80GB-00"
    assert written[ANNOTATION_GPUMEM_MIB] == "8000"
    assert written[ANNOTATION_GPUCORES] == "30"
    assert written[ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATING
    node = cluster.ledger.node_names.index("a100-0")
    assert cluster.ledger.view.free_gpu_milli[node, 0] == 700


def test_second_share_lands_on_the_same_gpu_best_fit(cluster, api):
    with client_for(cluster) as http:
        for name in ("a", "b"):
            pod = pod_json(name, GPU1_8G)
            api.pods[("team-a", name)] = pod
            assert http.post("/bind", json=binding(pod, "a100-0")).json() == {"Error": ""}
    assert api.annotations_of("a")[ANNOTATION_GPU_INDICES] == api.annotations_of("b")[ANNOTATION_GPU_INDICES]


def test_bind_reads_the_pod_from_the_api_when_filter_never_saw_it(cluster, api):
    pod = pod_json("fresh", {"gpuslice.io/gpu": "2"})
    api.pods[("team-a", "fresh")] = pod
    with client_for(cluster) as http:
        assert http.post("/bind", json=binding(pod, "a100-0")).json() == {"Error": ""}
    written = api.annotations_of("fresh")
    assert written[ANNOTATION_GPU_INDICES] == "0,1"
    assert written[ANNOTATION_GPUMEM_MIB] == "0"  # whole GPUs: all their memory
    assert written[ANNOTATION_GPUCORES] == "100"


def test_bind_that_no_longer_fits_is_refused_with_the_reason_and_changes_nothing(api):
    state = make_state(api, {"t4": inventory("T4", gpus=1, memory_mib=15109)})
    whole = {"gpuslice.io/gpu": "1"}
    first, second = pod_json("first", whole), pod_json("second", whole)
    api.pods.update({("team-a", "first"): first, ("team-a", "second"): second})
    with client_for(state) as http:
        # both passed filter before either was bound (the race HAMi's node lock exists for)
        assert http.post("/filter", json=args(first, ["t4"])).json()["NodeNames"] == ["t4"]
        assert http.post("/filter", json=args(second, ["t4"])).json()["NodeNames"] == ["t4"]
        assert http.post("/bind", json=binding(first, "t4")).json() == {"Error": ""}
        error = http.post("/bind", json=binding(second, "t4")).json()["Error"]
    assert "no longer fits: insufficient free GPU" in error
    assert [b[1] for b in api.bindings] == ["first"]
    state.check_invariants()


def test_failed_binding_releases_the_reservation_and_marks_the_pod(api):
    api.fail_binding = True
    state = make_state(api, {"t4": inventory("T4", gpus=1, memory_mib=15109)})
    pod = pod_json("unlucky", {"gpuslice.io/gpu": "1"})
    api.pods[("team-a", "unlucky")] = pod
    with client_for(state) as http:
        error = http.post("/bind", json=binding(pod, "t4")).json()["Error"]
    assert "409 Conflict" in error
    assert api.annotations_of("unlucky")[ANNOTATION_BIND_PHASE] == BIND_PHASE_FAILED
    assert state.ledger.view.free_gpu_milli[0, 0] == 1000
    state.check_invariants()


def test_multi_gpu_bind_picks_the_nvlinked_gpus(api):
    # 4 GPUs: 0-1 and 2-3 joined by NVLink, other pairs over the socket link; GPU 0 is taken
    topo = (
        ("X", "NV4", "SYS", "SYS"),
        ("NV4", "X", "SYS", "SYS"),
        ("SYS", "SYS", "X", "NV4"),
        ("SYS", "SYS", "NV4", "X"),
    )
    state = make_state(api, {"n": inventory(gpus=4, topology=topo)})
    one, two = pod_json("one", {"gpuslice.io/gpu": "1"}), pod_json("two", {"gpuslice.io/gpu": "2"})
    api.pods.update({("team-a", "one"): one, ("team-a", "two"): two})
    with client_for(state) as http:
        assert http.post("/bind", json=binding(one, "n")).json() == {"Error": ""}
        assert http.post("/bind", json=binding(two, "n")).json() == {"Error": ""}
    assert api.annotations_of("one")[ANNOTATION_GPU_INDICES] == "0"
    assert api.annotations_of("two")[ANNOTATION_GPU_INDICES] == "2,3"  # not 1,2: those cross sockets


def test_mig_pod_gets_a_free_instance_and_a_second_one_is_refused(api):
    mig = {3: (MigSlot("3g.40gb", 0, "MIG-aaaa", 1), MigSlot("4g.40gb", 4, "MIG-bbbb", 2))}
    state = make_state(api, {"m": inventory(gpus=4, mig=mig)})
    first, second = (pod_json(n, {"gpuslice.io/mig-3g.40gb": "1"}) for n in ("first", "second"))
    api.pods.update({("team-a", "first"): first, ("team-a", "second"): second})
    with client_for(state) as http:
        assert http.post("/filter", json=args(first, ["m"])).json()["NodeNames"] == ["m"]
        assert http.post("/bind", json=binding(first, "m")).json() == {"Error": ""}
        reply = http.post("/filter", json=args(second, ["m"])).json()
        # a share must not land on the MIG-mode GPU either
        share = pod_json("share", {"gpuslice.io/gpu": "4"})
        assert http.post("/filter", json=args(share, ["m"])).json()["NodeNames"] == []
    assert api.annotations_of("first")[ANNOTATION_MIG_INSTANCE] == "3:3g.40gb@0:MIG-aaaa"
    assert reply["FailedNodes"] == {"m": REASON_NO_MIG_INSTANCE}


# ---- concurrency --------------------------------------------------------------------------------------


def test_concurrent_binds_on_one_node_never_share_a_gpu_and_do_not_queue_behind_api_calls():
    api = FakeApi(delay_s=0.2)  # every API call takes 200 ms
    state = make_state(api, {"n": inventory(gpus=8)})
    pods = [pod_json(f"p{i}", {"gpuslice.io/gpu": "1"}) for i in range(9)]
    for pod in pods:
        api.pods[("team-a", pod["metadata"]["name"])] = pod
    errors: dict[str, str] = {}

    def bind(pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        errors[meta["name"]] = state.bind(meta["namespace"], meta["name"], meta["uid"], "n")

    threads = [threading.Thread(target=bind, args=(p,)) for p in pods]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    ok = [name for name, error in errors.items() if not error]
    assert len(ok) == 8 and len(errors) == 9  # 8 GPUs, 9 pods: exactly one refused
    gpus = [api.annotations_of(name)[ANNOTATION_GPU_INDICES] for name in ok]
    assert sorted(gpus) == [str(i) for i in range(8)]
    # Held across the API calls, the lock would make this 8 x 0.4 s = 3.2 s; it is held for microseconds.
    assert elapsed < 1.5
    state.check_invariants()


# ---- watch --------------------------------------------------------------------------------------------


def _bound_pod(name: str, node: str, gpus: str, resources: Mapping[str, str]) -> dict[str, Any]:
    decision = Decision(node, "train", tuple(int(g) for g in gpus.split(",")), (), 0, 100)
    return pod_json(name, resources, decision.to_annotations(), node=node)


def test_watch_holds_pods_bound_before_a_restart_and_releases_them_when_they_go(api):
    state = make_state(api, {"n": inventory(gpus=2)})
    pod = _bound_pod("old", "n", "0,1", {"gpuslice.io/gpu": "2"})
    state.apply(WatchEvent("Pod", "ADDED", pod))
    assert state.ledger.view.free_gpu_milli[0, :2].tolist() == [0, 0]
    new = pod_json("new", {"gpuslice.io/gpu": "1"})
    assert state.filter(new, ["n"]).passed == []
    state.apply(WatchEvent("Pod", "MODIFIED", {**pod, "status": {"phase": "Succeeded"}}))
    assert state.filter(new, ["n"]).passed == ["n"]
    state.check_invariants()


def test_pods_seen_before_their_node_are_held_once_the_node_appears(api):
    state = make_state(api, {})
    state.apply(WatchEvent("Pod", "ADDED", _bound_pod("early", "late-node", "0", {"gpuslice.io/gpu": "1"})))
    state.apply(node_event("late-node", inventory(gpus=1)))
    assert state.ledger.view.free_gpu_milli[0, 0] == 0


def test_node_heartbeats_do_not_rebuild_the_ledger_but_inventory_changes_do(api):
    state = make_state(api, {"n": inventory(gpus=2)})
    before = state.ledger
    state.apply(node_event("n", inventory(gpus=2), kind="MODIFIED"))
    assert state.ledger is before
    state.apply(node_event("n", inventory(gpus=4), kind="MODIFIED"))
    assert state.ledger is not before
    assert state.ledger.view.gpu_count.tolist() == [4]
    state.apply(node_event("n", None, kind="DELETED"))
    assert state.filter(pod_json("p", {"gpuslice.io/gpu": "1"}), ["n"]).unresolvable == {
        "n": REASON_NO_INVENTORY
    }


def test_a_relist_forgets_pods_and_nodes_deleted_while_no_watch_ran(api):
    state = make_state(api, {"n": inventory(gpus=2), "gone": inventory(gpus=1)})
    kept = _bound_pod("kept", "n", "0", {"gpuslice.io/gpu": "1"})
    lost = _bound_pod("lost", "n", "1", {"gpuslice.io/gpu": "1"})
    state.apply(WatchEvent("Pod", "ADDED", kept))
    state.apply(WatchEvent("Pod", "ADDED", lost))
    assert state.filter(pod_json("p", {"gpuslice.io/gpu": "1"}), ["n"]).passed == []
    state.apply(WatchEvent("Pod", RELISTED, {"items": [kept]}))
    state.apply(WatchEvent("Node", RELISTED, {"items": [{"metadata": {"name": "n"}}]}))
    assert state.filter(pod_json("p", {"gpuslice.io/gpu": "1"}), ["n", "gone"]).passed == ["n"]
    assert state.ledger.node_names == ("n",)
    state.check_invariants()


def test_a_malformed_inventory_leaves_the_node_out(api):
    state = make_state(api, {})
    state.apply(node_event("broken", None, **{ANNOTATION_NODE_INVENTORY: "{not json"}))
    result = state.filter(pod_json("p", {"gpuslice.io/gpu": "1"}), ["broken"])
    assert result.unresolvable == {"broken": REASON_NO_INVENTORY}


def test_watch_follows_a_source_on_startup(api):
    events = [
        node_event("n", inventory(gpus=1)),
        WatchEvent("Node", RELISTED, {"items": [{"metadata": {"name": "n"}}]}),
        WatchEvent("Pod", RELISTED, {"items": []}),
    ]
    state = ClusterState(api)
    with TestClient(create_app(state, events)) as http:
        for _ in range(100):
            reply = http.post("/filter", json=args(pod_json("p", {"gpuslice.io/gpu": "1"}), ["n"])).json()
            if reply["NodeNames"]:
                break
            time.sleep(0.01)
    assert reply["NodeNames"] == ["n"]


def test_a_restarted_extender_decides_nothing_until_it_has_listed_every_pod(api):
    """The watch has listed the node but not yet the pods: one of them already holds the only GPU. Until
    the pod list is in, filter and bind answer an error (kube-scheduler retries), preempt offers nothing
    and /healthz is 503; afterwards the filter sees the GPU taken."""
    pods_listed = threading.Event()
    holder = _bound_pod("holder", "n", "0", {"gpuslice.io/gpu": "1"})

    def source():
        yield node_event("n", inventory(gpus=1))
        yield WatchEvent("Node", RELISTED, {"items": [{"metadata": {"name": "n"}}]})
        pods_listed.wait(10)
        yield WatchEvent("Pod", "ADDED", holder)
        yield WatchEvent("Pod", RELISTED, {"items": [holder]})

    state = ClusterState(api)
    asking = pod_json("p", {"gpuslice.io/gpu": "1"})
    with TestClient(create_app(state, source())) as http:
        health = http.get("/healthz")
        assert health.status_code == 503 and health.json()["ok"] is False
        assert "starting" in http.post("/filter", json=args(asking, ["n"])).json()["Error"]
        bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n"}
        assert "starting" in http.post("/bind", json=bind).json()["Error"]
        assert http.post("/preempt", json={"Pod": asking, "NodeNameToMetaVictims": {}}).json() == {
            "NodeNameToMetaVictims": {}
        }
        assert api.bindings == []
        pods_listed.set()
        for _ in range(200):
            if http.get("/healthz").status_code == 200:
                break
            time.sleep(0.01)
        reply = http.post("/filter", json=args(asking, ["n"])).json()
    assert reply["NodeNames"] == [] and "n" in reply["FailedNodes"]


def test_healthz_answers(cluster):
    with client_for(cluster) as http:
        assert http.get("/healthz").json() == {"ok": True, "conflicts": 0}


# ---- the deployed configuration -----------------------------------------------------------------------


def test_deployed_scheduler_config_matches_the_extender():
    """deploy/kubernetes/20-scheduler.yaml registers exactly our verbs, port and managed resources."""
    from pathlib import Path

    import yaml

    from gpuslice.hardware.mig import MIG_GPUS
    from gpuslice.k8s.annotations import managed_resources

    path = Path(__file__).parents[2] / "deploy" / "kubernetes" / "20-scheduler.yaml"
    config_map, deployment = yaml.safe_load_all(path.read_text())
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    (ext,) = config["extenders"]
    routes = {r.path for r in create_app(ClusterState(FakeApi())).routes}
    assert {f"/{ext[v]}" for v in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")} <= routes
    assert ext["nodeCacheCapable"] is True and ext["weight"] > 0
    (extender,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"]
    port = extender["command"][extender["command"].index("--port") + 1]
    assert ext["urlPrefix"] == f"http://127.0.0.1:{port}"
    profiles = sorted({p.name for gpu in MIG_GPUS.values() for p in gpu.profiles})
    managed = {m["name"]: m["ignoredByScheduler"] for m in ext["managedResources"]}
    assert set(managed) == set(managed_resources(profiles))
    ignored = {name for name, flag in managed.items() if flag}
    assert ignored == {"gpuslice.io/gpumem", "gpuslice.io/gpucores"}  # the two no node advertises
    assert config["profiles"][0]["schedulerName"] == "gpuslice-scheduler"
    # every feasible node reaches the extender, not kube-scheduler's adaptive sample (50 % at 100
    # nodes, down to 5 % in large clusters)
    assert config["percentageOfNodesToScore"] == 100


@pytest.mark.parametrize(
    "hosts",
    [["a100-0", "node.example.com", "x"], ['we"ird', "back\\slash"], [], ["ünïcode", "ok"], [7, "n"]],
    ids=["dns names", "quote and backslash", "empty", "non-ascii", "not a string"],
)
def test_host_priority_list_is_valid_json_whatever_the_names(hosts):
    import json

    import numpy as np

    from gpuslice.k8s.extender_wire import host_priorities

    scores = np.arange(len(hosts), dtype=np.int64) * 5
    text = host_priorities(hosts, scores)
    assert json.loads(text) == [{"Host": h, "Score": int(s)} for h, s in zip(hosts, scores, strict=True)]


# ---- preempt ------------------------------------------------------------------------------------------


def test_preempt_keeps_only_candidates_whose_victims_free_a_fitting_gpu(api):
    state = make_state(api, {"a": inventory(gpus=1), "b": inventory(gpus=2), "t4": inventory("T4", gpus=1)})
    held = {
        "a-big": _bound_pod("a-big", "a", "0", {"gpuslice.io/gpu": "1"}),
        "b-0": _bound_pod("b-0", "b", "0", {"gpuslice.io/gpu": "1"}),
        "b-1": _bound_pod("b-1", "b", "1", {"gpuslice.io/gpu": "1"}),
        "t4-0": _bound_pod("t4-0", "t4", "0", {"gpuslice.io/gpu": "1"}),
    }
    for p in held.values():
        state.apply(WatchEvent("Pod", "ADDED", p))
    pending = pod_json("urgent", {"gpuslice.io/gpu": "1"}, {ANNOTATION_EXCLUDE_GPU_MODELS: "T4"})
    pending["spec"]["priority"] = 100  # kube-scheduler proposes only pods of lower priority as victims
    body = {
        "Pod": pending,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "a": {"Pods": [{"UID": "uid-a-big"}], "NumPDBViolations": 0},  # frees the only GPU: kept
            "b": {"Pods": [], "NumPDBViolations": 0},  # evicts nothing: both GPUs stay taken
            "t4": {"Pods": [{"UID": "uid-t4-0"}], "NumPDBViolations": 1},  # model excluded
        },
    }
    with client_for(state) as http:
        reply = http.post("/preempt", json=body).json()
    assert reply == {"NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "uid-a-big"}], "NumPDBViolations": 0}}}
    state.check_invariants()  # a what-if: nothing was released


def test_preempt_of_a_share_needs_the_victim_on_a_gpu_with_room(api):
    state = make_state(api, {"n": inventory(gpus=2, split=10)})
    for name, gpu in (("x", "0"), ("y", "1")):
        share = {"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "60"}
        decision = Decision("n", "train", (int(gpu),), (), 0, 60)
        state.apply(WatchEvent("Pod", "ADDED", pod_json(name, share, decision.to_annotations(), node="n")))
    pending = pod_json("p", {"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "70"})
    pending["spec"]["priority"] = 100
    assert state.preempt(pending, {"n": ["uid-x"]}) == {"n": ["uid-x"]}
    assert state.preempt(pending, {"n": ["uid-someone-else"]}) == {}
