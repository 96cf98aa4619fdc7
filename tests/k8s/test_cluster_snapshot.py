"""The extender's cluster view (k8s/extender/snapshot.py): a small cluster with a whole GPU, shares, a MIG
instance and an unhealthy GPU gives exact values; a refused pod is pending with its code, reason and
since until it passes a node, binds or goes; the fragmentation is the ledger's FGD figure; the history
keeps one sample per interval for its maximum age."""

from __future__ import annotations

import json
import threading
import time
import types
from typing import Any

import numpy as np
import pytest
from test_extender import FakeApi, _bound_pod, inventory, make_state, node_event, pod_json
from test_extender_containers import SHARE as SHARE_40G
from test_extender_containers import SMALL, two_container_pod
from test_extender_decide import BIG, full_node, with_priority
from test_extender_mig_ledger import RESOURCES as MIG_3G
from test_extender_mig_ledger import SLOTS

from gpuslice.k8s.annotations import InventoryGpu, NodeInventory
from gpuslice.k8s.decision import Decision, MigChoice
from gpuslice.k8s.extender import ClusterState, WatchEvent
from gpuslice.k8s.extender import cluster as cluster_module
from gpuslice.k8s.extender.snapshot import FragmentationHistory, cluster_figures, cluster_view
from gpuslice.ledger.fragmentation import FragmentationMeasure
from gpuslice.observe.cluster_metrics import ClusterFigures
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

WHOLE = {"gpuslice.io/gpu": "1"}
SHARE = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "20000", "gpuslice.io/gpucores": "20"}
CORES_ONLY = {"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "30"}
TWO = {"gpuslice.io/gpu": "2"}
MIB_80G = 81920


def _mig_pod(name: str, node: str, start: int) -> dict[str, Any]:
    mig = MigChoice(1, "3g.40gb", start, f"MIG-{start}")
    decision = Decision(node, "train", (1,), ("GPU-A100-80GB-01",), 0, 100, mig)
    return pod_json(name, MIG_3G, decision.to_annotations(), node=node)


def _half_unhealthy() -> NodeInventory:
    return NodeInventory(
        (
            InventoryGpu(0, "GPU-u-0", "A100-80GB", MIB_80G),
            InventoryGpu(1, "GPU-u-1", "A100-80GB", MIB_80G, healthy=False),
        )
    )


def known_cluster(api: FakeApi | None = None) -> ClusterState:
    """a: a whole GPU on GPU 0, a 20 % / 20,000 MiB share on GPU 1; m: GPU 1 in MIG mode with a 3g.40gb
    instance held; u: a 30 % share without a memory limit on GPU 0, GPU 1 unhealthy."""
    state = make_state(
        api or FakeApi(), {"a": inventory(gpus=2), "m": inventory(gpus=2, mig=SLOTS), "u": _half_unhealthy()}
    )
    for pod in (
        _bound_pod("whole", "a", "0", WHOLE),
        _bound_pod("share", "a", "1", SHARE),
        _mig_pod("mig", "m", 0),
        _bound_pod("cores", "u", "0", CORES_ONLY),
    ):
        state.apply(WatchEvent("Pod", "ADDED", pod))
    return state


def _slice(
    pod: str,
    milli: int,
    mib: int,
    profile: str | None = None,
    start: int | None = None,
    slots: int | None = None,
) -> dict:
    return {
        "pod": f"team-a/{pod}",
        "milli": milli,
        "memory_mib": mib,
        "mig_profile": profile,
        "mig_start": start,
        "mig_slots": slots,
    }


def _gpu(node: str, index: int, free: int, free_mib: int, slices: list, **kw: Any) -> dict[str, Any]:
    uuid = f"GPU-u-{index}" if node == "u" else f"GPU-A100-80GB-{index:02d}"
    return {
        "index": index,
        "uuid": uuid,
        "healthy": kw.get("healthy", True),
        "mig": kw.get("mig", False),
        "milli_free": free,
        "memory_mib": MIB_80G,
        "memory_free_mib": free_mib,
        "slices": slices,
    }


# The target is the bound pods' shapes when the ledger was built: 200, 300 and 1000 milli, 1/3 each (MIG
# pods are no GPU shape). a: GPU 1's 800 free fit both shares, not a whole GPU: 800 / 3 fragmented.
# u: GPU 0's 700 likewise: 700 / 3. m: GPU 0 is whole and free, GPU 1 in MIG mode is held whole: 0.
FRAGMENTED = {"a": 800 / 3, "m": 0.0, "u": 700 / 3}

EXPECTED_NODES = [
    {
        "name": "a",
        "model": "A100-80GB",
        "unallocated_percent": 40.0,  # 800 of 2,000 milli-GPU
        "fragmentation_percent": pytest.approx(100 * FRAGMENTED["a"] / 2000),
        "gpus": [
            _gpu("a", 0, 0, 0, [_slice("whole", 1000, MIB_80G)]),  # a whole GPU holds all its memory
            _gpu("a", 1, 800, MIB_80G - 20000, [_slice("share", 200, 20000)]),
        ],
    },
    {
        "name": "m",
        "model": "A100-80GB",
        "unallocated_percent": 78.6,  # 1,000 + (1,000 - 428): 3 of 7 compute slices count 428 milli-GPU
        "fragmentation_percent": 0.0,
        "gpus": [
            _gpu("m", 0, 1000, MIB_80G, []),
            # 4 of 8 memory slices: half the GPU's memory
            _gpu("m", 1, 572, MIB_80G // 2, [_slice("mig", 428, MIB_80G // 2, "3g.40gb", 0, 4)], mig=True),
        ],
    },
    {
        "name": "u",
        "model": "A100-80GB",
        "unallocated_percent": 35.0,  # GPU 0's 700; the unhealthy GPU is neither free nor allocated
        "fragmentation_percent": pytest.approx(100 * FRAGMENTED["u"] / 2000),
        "gpus": [
            _gpu("u", 0, 700, 0, [_slice("cores", 300, MIB_80G)]),  # no memory limit: all of it is given
            _gpu("u", 1, 0, 0, [], healthy=False),
        ],
    },
]


def test_a_known_cluster_gives_exact_nodes_gpus_slices_and_totals():
    state = known_cluster()
    view = cluster_view(state)
    assert view["nodes"] == EXPECTED_NODES
    assert view["totals"] == {
        "nodes": 3,
        "gpus": 6,
        "unallocated_percent": pytest.approx(100 * 3072 / 6000),
        "fragmentation_percent": pytest.approx(100 * 500 / 6000),
        "pending": 0,
        "preemptions": 0,
        "capacity_milli": 6000,
        "allocated_milli": 1000 + 200 + 428 + 300,
        "fragmented_milli": pytest.approx(500.0),
    }
    assert view["fragmentation_target"] == "bound pods"
    assert view["pending"] == [] and view["claims"] == [] and view["history"] == []
    assert view["synced"] is False  # no full list was applied
    assert abs(view["time"] - time.time()) < 5
    json.dumps(view)  # plain JSON types throughout


def test_the_figures_are_the_views_per_node_in_metric_units():
    state = known_cluster()
    f = cluster_figures(state)
    assert list(f.nodes) == ["a", "m", "u"] and list(f.models) == ["A100-80GB"] * 3
    assert f.gpus.tolist() == [2, 2, 2]
    assert f.allocated_milli.tolist() == [1200, 428, 300]
    mib = 1 << 20
    assert f.allocated_memory_bytes.tolist() == [(MIB_80G + 20000) * mib, MIB_80G // 2 * mib, MIB_80G * mib]
    assert f.gpu_memory_bytes.tolist() == [2 * MIB_80G * mib] * 3
    assert f.unallocated_milli.tolist() == [800, 1572, 700]
    assert f.fragmented_milli.tolist() == pytest.approx([FRAGMENTED[n] for n in "amu"])


OPERATORS = TargetWorkload.from_requests([Request(0, num_gpu=1, gpu_milli=900)])


@pytest.mark.parametrize("target", [None, OPERATORS], ids=["bound pods' shapes", "operator's target"])
def test_fragmentation_is_the_ledgers_fgd_figure_for_the_same_state(target):
    state = known_cluster()
    state.cache.target = target
    view = cluster_view(state)
    built = state.cache.ledgered()
    used = target or built.targets
    ledger = built.ledger.view
    fgd = FragmentationMeasure(used, ledger.models)(
        ledger.free_gpu_milli, ledger.free_cpu_milli, ledger.node_model
    )
    assert [n["fragmentation_percent"] for n in view["nodes"]] == pytest.approx((fgd / 2000 * 100).tolist())
    assert view["totals"]["fragmented_milli"] == pytest.approx(float(fgd.sum()))
    assert view["fragmentation_target"] == ("operator" if target else "bound pods")
    assert fgd.sum() > 0  # the case measures something


def test_before_any_pod_the_fragmentation_is_against_one_whole_gpu():
    state = make_state(FakeApi(), {"a": inventory(gpus=2)})
    assert cluster_view(state)["fragmentation_target"] == "one whole GPU"
    assert cluster_view(state)["totals"]["fragmented_milli"] == 0.0


def test_a_cluster_without_gpuslice_nodes_is_empty_not_a_placeholder_node():
    view = cluster_view(make_state(FakeApi(), {}))
    assert view["nodes"] == []
    assert view["totals"]["nodes"] == 0 and view["totals"]["gpus"] == 0
    assert view["totals"]["unallocated_percent"] == 0.0 and view["totals"]["fragmentation_percent"] == 0.0


def test_each_container_slice_of_a_pod_is_shown_where_it_is_held():
    """A pod whose two app containers ask gets two slices (the kubelet allocates each container's): both
    are the pod's, here packed on one GPU by bestfit."""
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=2)})
    pod = two_container_pod("two", SHARE_40G, SMALL)
    api.pods[("team-a", "two")] = pod
    assert state.filter(pod, ["n"]).passed == ["n"]
    assert state.bind("team-a", "two", "uid-two", "n") == ""
    gpus = cluster_view(state)["nodes"][0]["gpus"]
    assert [g["slices"] for g in gpus] == [[_slice("two", 300, 40000), _slice("two", 100, 10000)], []]
    assert cluster_figures(state).allocated_milli.tolist() == [400]


# ---- pending pods ----------------------------------------------------------------------------------------


def _pending(state: ClusterState) -> dict[str, dict[str, Any]]:
    return {p["pod"]: p for p in cluster_view(state)["pending"]}


def test_a_refused_pod_is_pending_with_its_code_reason_and_since_until_it_binds():
    api = FakeApi()
    state = known_cluster(api)
    before = time.time()
    pod = pod_json("two", TWO)
    assert state.filter(pod, ["a", "m", "u"]).passed == []
    pending = _pending(state)["team-a/two"]
    state.flush_events()
    # the most nodes' refusal: on m and u one GPU is in MIG mode or unhealthy (a: the two are taken)
    assert pending["code"] == "no_usable_gpu"
    assert pending["reason"] == api.events[-1][3]  # the FailedScheduling line, amounts and all
    assert pending["reason"].startswith("gpuslice: 0/3 nodes fit: 2 no GPU here can take it")
    assert pending["reason"].endswith("; closest: m (need 2, free 1 of 2 GPUs)")
    assert before <= pending["since"] <= time.time()
    assert cluster_view(state)["totals"]["pending"] == 1
    # refused again: the same since; then a node frees up, the pod passes and binds
    state.filter(pod, ["a", "m", "u"])
    assert _pending(state)["team-a/two"]["since"] == pending["since"]
    state.apply(WatchEvent("Pod", "DELETED", _bound_pod("whole", "a", "0", WHOLE)))
    state.apply(WatchEvent("Pod", "DELETED", _bound_pod("share", "a", "1", SHARE)))
    assert state.filter(pod, ["a", "m", "u"]).passed == ["a"]
    assert _pending(state) == {}
    api.pods[("team-a", "two")] = pod
    assert state.bind("team-a", "two", "uid-two", "a") == ""
    assert _pending(state) == {} and cluster_view(state)["totals"]["pending"] == 0


@pytest.mark.parametrize(
    "event",
    [
        WatchEvent("Pod", "MODIFIED", pod_json("two", TWO, node="elsewhere")),  # bound by another scheduler
        WatchEvent("Pod", "DELETED", pod_json("two", TWO)),
        WatchEvent("Pod", "MODIFIED", {**pod_json("two", TWO), "status": {"phase": "Failed"}}),
        WatchEvent("Pod", "RELISTED", {"items": []}),  # deleted while no watch ran
    ],
    ids=["bound elsewhere", "deleted", "failed", "gone at a relist"],
)
def test_a_pending_pod_leaves_the_list_when_the_watch_says_it_is_bound_or_gone(event):
    state = known_cluster()
    state.filter(pod_json("two", TWO), ["a", "m", "u"])
    state.filter(pod_json("other", TWO), ["a", "m", "u"])
    assert set(_pending(state)) == {"team-a/two", "team-a/other"}
    state.apply(event)
    assert "team-a/two" not in _pending(state)
    if event.type != "RELISTED":
        assert set(_pending(state)) == {"team-a/other"}


def test_an_invalid_request_waits_with_its_own_code():
    state = known_cluster()
    state.filter(pod_json("bad", {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "lots"}), ["a"])
    bad = _pending(state)["team-a/bad"]
    assert bad["code"] == "invalid_request" and "invalid gpuslice request" in bad["reason"]


def test_a_pod_that_preempts_waits_with_the_code_preempting_and_the_preemptions_are_counted():
    api = FakeApi()
    state = full_node(api)
    state.filter(with_priority(pod_json("urgent", BIG), 100), ["n"])
    assert api.deleted == [("team-a", "low", "uid-low")]
    urgent = _pending(state)["team-a/urgent"]
    assert urgent["code"] == "preempting"
    assert cluster_view(state)["totals"]["preemptions"] == 1 == cluster_figures(state).preemptions


def test_pending_pods_are_listed_oldest_first(monkeypatch):
    state = known_cluster()
    clock = iter([300.0, 100.0, 200.0])
    fake = types.SimpleNamespace(time=lambda: next(clock), monotonic=time.monotonic)
    monkeypatch.setattr(cluster_module, "time", fake)
    for name in ("c", "a", "b"):
        state.filter(pod_json(name, TWO), ["a"])
    assert [(p["pod"], p["since"]) for p in cluster_view(state)["pending"]] == [
        ("team-a/a", 100.0), ("team-a/b", 200.0), ("team-a/c", 300.0)
    ]  # fmt: skip


# ---- nodes come and go ------------------------------------------------------------------------------


def test_a_node_removed_is_gone_from_the_view_and_its_pods_with_it():
    state = known_cluster()
    state.apply(node_event("a", None, kind="DELETED"))
    view = cluster_view(state)
    assert [n["name"] for n in view["nodes"]] == ["m", "u"]
    assert view["totals"]["gpus"] == 4
    assert view["totals"]["allocated_milli"] == 428 + 300  # a's pods are held nowhere now


class _RebuiltDuringTheRead(dict):
    """The cache's pending pods, read last under the lock by a view: the first read adds a node that
    sorts first, so the ledger is rebuilt and every pod's placement moves to the next row."""

    def __init__(self, state: ClusterState) -> None:
        super().__init__()
        self.state = state
        self.fired = False

    def values(self) -> Any:
        if not self.fired:
            self.fired = True
            self.state.apply(node_event("0-new", inventory(gpus=2)))
            self.state.cache.ledgered()
        return super().values()


def test_a_view_that_saw_the_ledger_rebuilt_while_it_read_reads_again():
    state = known_cluster()
    state.cache.ledgered()
    state.cache.pending = _RebuiltDuringTheRead(state)
    view = cluster_view(state)
    assert [n["name"] for n in view["nodes"]] == ["0-new", "a", "m", "u"]
    assert view["nodes"][1:] == EXPECTED_NODES
    assert view["nodes"][0]["unallocated_percent"] == 100.0
    assert [g["slices"] for g in view["nodes"][0]["gpus"]] == [[], []]


def test_views_taken_while_pods_bind_always_agree_with_the_ledger():
    """The view copies the ledger under the cache's lock: whatever binds run beside it, its slices sum to
    each GPU's allocation, and its fragmentation is FGD's measure of those same GPUs."""
    api = FakeApi()
    state = make_state(api, {f"n{i}": inventory(gpus=8) for i in range(4)})
    stop = threading.Event()
    errors: list[str] = []

    def bind_many() -> None:
        for k in range(200):
            pod = pod_json(f"p{k}", {"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "10"})
            api.pods[("team-a", f"p{k}")] = pod
            state.bind("team-a", f"p{k}", f"uid-p{k}", f"n{k % 4}")
        stop.set()

    worker = threading.Thread(target=bind_many)
    worker.start()
    views = 0
    while not stop.is_set() or views < 3:
        view = cluster_view(state)
        views += 1
        for node in view["nodes"]:
            for gpu in node["gpus"]:
                held = sum(s["milli"] for s in gpu["slices"])
                if held + gpu["milli_free"] != 1000:
                    errors.append(f"{node['name']}/{gpu['index']}: {held} + {gpu['milli_free']}")
            # no pod was bound when the ledger was built: the target is one whole GPU
            free = np.array([g["milli_free"] for g in node["gpus"]])
            fragmented = 100 * free[free < 1000].sum() / 8000
            if node["fragmentation_percent"] != pytest.approx(fragmented):
                errors.append(f"{node['name']}: {node['fragmentation_percent']} % fragmented, {free}")
    worker.join()
    assert not errors
    assert cluster_view(state)["totals"]["allocated_milli"] == 200 * 100


# ---- history ----------------------------------------------------------------------------------------------


def _figures(unallocated: int, fragmented: float) -> ClusterFigures:
    one = np.array([1])
    return ClusterFigures(
        ["a"], ["H100"], one, one, one * 0, one * 0, one * unallocated, np.array([fragmented])
    )


def test_history_keeps_one_sample_per_interval_for_its_maximum_age():
    history = FragmentationHistory(interval_s=30, max_age_s=90)
    for t, unallocated in ((0, 1000), (10, 900), (30, 800), (61, 700), (91, 600), (130, 500)):
        history.observe(_figures(unallocated, 250.0), t)
    # 10 came within 30 s of 0: not kept (30 s after, 30 and 91 are); 0 and 30 are older than 90 s at 130
    assert [s["t"] for s in history.samples(now=160)] == [91, 130]  # as of a later time
    assert history.samples() == [
        {"t": 61, "unallocated_percent": 70.0, "fragmentation_percent": 25.0},
        {"t": 91, "unallocated_percent": 60.0, "fragmentation_percent": 25.0},
        {"t": 130, "unallocated_percent": 50.0, "fragmentation_percent": 25.0},
    ]


def test_history_is_a_ring_bounded_by_its_maximum_age():
    history = FragmentationHistory(interval_s=1, max_age_s=10)
    for t in range(1000):
        history.observe(_figures(1000, 0.0), float(t))
    assert len(history._samples) == 11
    assert [s["t"] for s in history.samples()] == [float(t) for t in range(989, 1000)]


def test_history_refuses_an_interval_it_cannot_keep():
    for interval, age in ((0, 10), (-1, 10), (20, 10), (float("nan"), 10)):
        with pytest.raises(ValueError, match="interval_s"):
            FragmentationHistory(interval, age)


def test_the_view_and_the_figures_sample_the_history_they_are_given():
    state = known_cluster()
    history = FragmentationHistory(interval_s=0.001)
    cluster_figures(state, history)
    time.sleep(0.01)
    view = cluster_view(state, history)
    assert len(view["history"]) == 2
    latest = view["history"][-1]
    assert latest["unallocated_percent"] == pytest.approx(view["totals"]["unallocated_percent"])
    assert latest["fragmentation_percent"] == pytest.approx(view["totals"]["fragmentation_percent"])
    assert latest["t"] == view["time"]
