"""The extender's verbs (k8s/extender/state.py) where the mutation run found them untested: the scores'
rescaling and their JSON type, scores on a one-node cluster, MIG scores, the policy's own filter under
--decide, holds that expire, a Binding the API server had made already, and the FailedScheduling Event
of an invalid pod, a MIG pod and a pod whose closest node has full share slots."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from test_extender import FakeApi, _bound_pod, client_for, inventory, make_state, node_event, pod_json
from test_extender_bind_race import BindingApi
from test_extender_containers import SHARE as SHARE_40G
from test_extender_containers import two_container_pod
from test_extender_decide import BIG, full_node, with_priority
from test_extender_mig_ledger import RESOURCES as MIG_3G
from test_extender_mig_ledger import SLOTS

from gpuslice.k8s.annotations import MigSlot
from gpuslice.k8s.decision import Decision, MigChoice
from gpuslice.k8s.extender import REASON_RESERVED, ClusterState, WatchEvent
from gpuslice.k8s.extender import state as state_module
from gpuslice.k8s.extender.cluster import Nomination
from gpuslice.k8s.extender.kube import AlreadyBound
from gpuslice.k8s.extender.state import MAX_EXTENDER_PRIORITY, _rescale
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

WHOLE = {"gpuslice.io/gpu": "1"}
SHARE = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "20000", "gpuslice.io/gpucores": "20"}


# ---- scores ------------------------------------------------------------------------------------------


def test_scores_are_rescaled_from_the_worst_to_the_best_feasible_node_and_infeasible_ones_get_zero():
    raw = np.array([2.0, 3.0, 4.0, -np.inf, 2.5])
    assert _rescale(raw).tolist() == [0, 5, 10, 0, 2]
    assert _rescale(np.array([-6.0, -2.0])).tolist() == [0, MAX_EXTENDER_PRIORITY]
    assert _rescale(np.array([7.0, 7.0, np.nan])).tolist() == [10, 10, 0]
    assert _rescale(np.array([-np.inf, np.inf])).tolist() == [0, 0]


@pytest.mark.parametrize(
    "pod",
    [
        pod_json("cpu-only", {"cpu": "1"}),
        pod_json("invalid", {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "lots"}),
    ],
    ids=["no GPU asked", "invalid request"],
)
def test_a_pod_the_extender_does_not_place_scores_integer_zero_on_every_node(pod):
    state = make_state(FakeApi(), {"a": inventory(), "b": inventory()})
    state.apply(WatchEvent("Pod", "ADDED", _bound_pod("old", "b", "1", SHARE)))
    assert state.prioritize(pod, ["a", "b", "c"]) == [("a", 0), ("b", 0), ("c", 0)]
    assert state.scores(pod, ["a", "b", "c"]).dtype == np.int64
    with client_for(state) as http:
        reply = http.post("/prioritize", json={"Pod": pod, "Nodes": None, "NodeNames": ["a", "b"]}).json()
    assert reply == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 0}]
    assert all(type(h["Score"]) is int for h in reply)  # kube-scheduler decodes an int64


@pytest.mark.parametrize("resources", [SHARE, MIG_3G], ids=["share", "MIG"])
def test_a_one_node_cluster_scores_a_node_name_it_does_not_know_zero(resources):
    state = make_state(FakeApi(), {"only": inventory(gpus=2, mig=SLOTS)})
    assert state.prioritize(pod_json("p", resources), ["only", "stranger"]) == [("only", 10), ("stranger", 0)]


def _bound_mig(name: str, node: str, start: int) -> WatchEvent:
    mig = MigChoice(1, "1g.10gb", start, f"MIG-{node}-{start}")
    decision = Decision(node, "train", (1,), ("GPU-A100-80GB-01",), 0, 100, mig)
    return WatchEvent(
        "Pod", "ADDED", pod_json(name, {"gpuslice.io/mig-1g.10gb": "1"}, decision.to_annotations(), node=node)
    )


def test_a_mig_pod_scores_nodes_by_how_full_their_fullest_gpu_with_a_free_instance_is():
    slots = {1: tuple(MigSlot("1g.10gb", s, f"MIG-{s}", s + 1) for s in range(7))}
    state = make_state(FakeApi(), {n: inventory(gpus=2, mig=slots) for n in ("empty", "one", "two", "full")})
    state.apply(_bound_mig("o1", "one", 0))
    state.apply(_bound_mig("t1", "two", 0))
    state.apply(_bound_mig("t2", "two", 1))
    for s in range(7):
        state.apply(_bound_mig(f"f{s}", "full", s))
    pod = pod_json("p", {"gpuslice.io/mig-1g.10gb": "1"})
    scores = dict(state.prioritize(pod, ["empty", "one", "two", "full", "cpu-0"]))
    assert scores == {"empty": 0, "one": 5, "two": 10, "full": 0, "cpu-0": 0}


# ---- --decide: the policy's own filter ---------------------------------------------------------------


def test_deciding_among_the_offered_nodes_only_even_when_the_policy_prefers_one_not_offered():
    state = make_state(FakeApi(), {"empty": inventory(), "used": inventory()})
    state.narrow = True
    state.apply(WatchEvent("Pod", "ADDED", _bound_pod("old", "used", "1", SHARE)))
    assert state.filter(pod_json("both", SHARE), ["empty", "used"]).passed == ["used"]  # bestfit packs
    result = state.filter(pod_json("new", SHARE), ["empty"])
    assert result.passed == ["empty"] and result.failed == {} and result.unresolvable == {}


class _RefusingPlacer:
    """A placer whose policy's own filter refuses every node."""

    def __init__(self, placer: Any) -> None:
        self._placer = placer

    def feasible(self, req: Any) -> np.ndarray:
        return np.zeros_like(self._placer.feasible(req))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._placer, name)


def test_deciding_when_the_policys_own_filter_refuses_every_fitting_node_passes_none(monkeypatch):
    state = make_state(
        FakeApi(), {"a": inventory(), "b": inventory(), "t4": inventory("T4", gpus=1, memory_mib=15109)}
    )
    state.narrow = True
    placer = state.cache.placer
    monkeypatch.setattr(state.cache, "placer", lambda built, ask: _RefusingPlacer(placer(built, ask)))
    pod = pod_json("p", {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "40000"})
    result = state.filter(pod, ["a", "b", "t4"])
    assert result.passed == []
    assert result.failed["a"] == result.failed["b"] == "excluded by the placement policy"
    assert result.failed["t4"].startswith("insufficient free GPU memory")


def test_deciding_a_mig_pod_when_the_mig_choice_finds_no_instance_passes_none(monkeypatch):
    state = make_state(FakeApi(), {n: inventory(gpus=2, mig=SLOTS) for n in ("a", "b")})
    state.narrow = True
    monkeypatch.setattr(state_module, "choose_mig_instance", lambda candidates, **kw: None)
    result = state.filter(pod_json("p", MIG_3G), ["a", "b"])
    assert result.passed == [] and set(result.failed) == {"a", "b"}


# ---- holds from filter to bind -----------------------------------------------------------------------


def test_a_filters_hold_is_kept_for_30_seconds_and_given_back_when_a_later_pod_is_held(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(state_module, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=lambda: 0))
    state = make_state(FakeApi(), {"n": inventory(gpus=2), "m": inventory(gpus=1)})
    state.narrow = True
    assert state.filter(pod_json("a", WHOLE), ["n"]).passed == ["n"]  # holds one GPU of n from t=1000
    now[0] = 1029.0
    assert state.filter(pod_json("b", WHOLE), ["n"]).passed == ["n"]  # a's hold is 29 s old: kept
    assert state.filter(pod_json("c", WHOLE), ["n"]).passed == []  # both GPUs of n held
    now[0] = 1031.0  # a's hold is 31 s old, b's 2 s: the next hold taken (d's, on m) gives a's back
    assert state.filter(pod_json("d", WHOLE), ["m"]).passed == ["m"]
    assert sorted(state.cache.assumed) == ["uid-b", "uid-d"]
    assert state.filter(pod_json("e", WHOLE), ["n"]).passed == ["n"]
    assert state.filter(pod_json("f", WHOLE), ["n"]).passed == []
    state.check_invariants()


# ---- a Binding the API server had made already --------------------------------------------------------


class _BoundBefore(FakeApi):
    """The API server already bound the pod (an earlier bind whose answer was lost) to ``node_name``;
    reading the pod fails when ``unreadable``."""

    def __init__(self, node_name: str = "", unreadable: bool = False) -> None:
        super().__init__()
        self.node_name = node_name
        self.unreadable = unreadable
        self.binds = 0

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.binds += 1
        raise AlreadyBound(f"pod {name} is already assigned to node {self.node_name!r}")

    def get_pod(self, namespace: str, name: str) -> Any:
        if self.unreadable:
            raise RuntimeError("the API server is away")
        pod = dict(super().get_pod(namespace, name))
        pod["spec"] = {**pod["spec"], "nodeName": self.node_name} if self.node_name else pod["spec"]
        return pod


def _bind_once(api: FakeApi, node: str = "a") -> tuple[Any, str]:
    state = make_state(api, {"a": inventory(gpus=1), "b": inventory(gpus=1)})
    pod = pod_json("p", WHOLE)
    api.pods[("team-a", "p")] = pod
    state.cache.remember(pod)
    return state, state.bind("team-a", "p", "uid-p", node)


def test_bound_before_to_this_node_is_a_success_and_a_retry_binds_nothing_more():
    api = _BoundBefore("a")
    state, error = _bind_once(api)
    assert error == ""
    assert state.bind("team-a", "p", "uid-p", "a") == "" and api.binds == 1
    assert state.filter(pod_json("q", WHOLE), ["a"]).passed == []  # the pod's GPU stays held


def test_bound_before_to_another_node_gives_this_nodes_hold_back_and_a_retry_names_that_node():
    api = _BoundBefore("b")
    state, error = _bind_once(api)
    assert error == "pod team-a/p is already bound to b"
    assert state.filter(pod_json("q", WHOLE), ["a"]).passed == ["a"]  # a's hold was given back
    assert state.bind("team-a", "p", "uid-p", "a") == "pod team-a/p is already bound to b"
    assert api.binds == 1


@pytest.mark.parametrize(
    "api", [_BoundBefore(""), _BoundBefore("a", unreadable=True)], ids=["no node", "unreadable"]
)
def test_bound_before_where_the_api_server_does_not_say_where_is_a_refusal_and_the_hold_stays(api):
    state, error = _bind_once(api)
    assert error.startswith("binding team-a/p to a refused: pod p is already assigned to node")
    assert state.filter(pod_json("q", WHOLE), ["a"]).passed == []


# ---- the FailedScheduling Event ----------------------------------------------------------------------


def _event(state, api: FakeApi, pod: dict[str, Any], names: list[str]) -> str:
    state.filter(pod, names)
    state.flush_events()
    assert len(api.events) == 1
    return api.events[0][3]


def test_an_invalid_pod_gets_one_event_counting_every_node():
    api = FakeApi()
    state = make_state(api, {"a": inventory(), "b": inventory()})
    pod = pod_json("bad", {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "lots"})
    message = _event(state, api, pod, ["a", "b", "c"])
    assert message.startswith("gpuslice: 0/3 nodes fit: 3 invalid")


def test_a_mig_pod_that_fits_nowhere_gets_an_event_without_a_closest_node():
    api = FakeApi()
    state = make_state(api, {"a": inventory(gpus=2, mig=SLOTS), "plain": inventory()})
    for name, start in (("x", 0), ("y", 4)):
        state.apply(_bound_mig_3g(name, "a", start))
    message = _event(state, api, pod_json("p", MIG_3G), ["a", "plain"])
    assert message.startswith("gpuslice: 0/2 nodes fit: ")
    assert "closest" not in message and "XX" not in message


def _bound_mig_3g(name: str, node: str, start: int) -> WatchEvent:
    mig = MigChoice(1, "3g.40gb", start, f"MIG-{start}")
    decision = Decision(node, "train", (1,), ("GPU-A100-80GB-01",), 0, 100, mig)
    return WatchEvent("Pod", "ADDED", pod_json(name, MIG_3G, decision.to_annotations(), node=node))


def test_a_pod_refused_on_every_node_for_its_model_gets_an_event_without_a_closest_node():
    api = FakeApi()
    state = make_state(api, {"a": inventory(), "b": inventory()})
    pod = pod_json("p", WHOLE, {"gpuslice.io/gpu-models": "H100"})
    message = _event(state, api, pod, ["a", "b"])
    assert "closest" not in message and "XX" not in message


def test_the_closest_node_of_a_share_counts_only_gpus_with_a_free_share_slot():
    """GPU 0 of node a has the most memory free but its two share slots are taken: the closest GPU
    named is one with a slot free."""
    api = FakeApi()
    state = make_state(api, {"a": inventory(gpus=2, split=2)})
    for name, gpu, mib in (("s1", "0", "1000"), ("s2", "0", "1000"), ("s3", "1", "70000")):
        state.apply(
            WatchEvent("Pod", "ADDED", _bound_pod(name, "a", gpu, {**SHARE, "gpuslice.io/gpumem": mib}))
        )
    pod = pod_json("p", {**SHARE, "gpuslice.io/gpumem": "30000"})
    message = _event(state, api, pod, ["a"])
    assert message.endswith("; closest: a (need 29.3 GiB, free 11.6 GiB of 80 GiB GPU memory)")


def test_a_pod_whose_containers_do_not_fit_together_is_refused_naming_each_containers_ask():
    state = make_state(FakeApi(), {"n": inventory(gpus=1)})
    big = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "50000", "gpuslice.io/gpucores": "10"}
    result = state.filter(two_container_pod("p", SHARE_40G, big), ["n"])
    assert result.failed["n"] == (
        "insufficient free GPU for every container together (container 'train': 40000 MiB, 30 % of 1 GPU; "
        "container 'log-shipper': 50000 MiB, 10 % of 1 GPU)"
    )


def test_a_pod_that_passes_gets_no_event_and_preempts_nothing():
    for narrow in (False, True):
        api = FakeApi()
        state = make_state(api, {"a": inventory(gpus=1), "b": inventory(gpus=1)})
        state.narrow = narrow
        result = state.filter(pod_json("p", WHOLE), ["a", "b"])
        assert result.passed == (["a"] if narrow else ["a", "b"])
        state.flush_events()
        assert api.events == [] and api.deleted == []


def test_a_pod_that_preempts_says_so_in_its_event_without_a_closest_node():
    api = FakeApi()
    state = full_node(api)
    state.filter(with_priority(pod_json("high", BIG), 100), ["n"])
    state.flush_events()
    (message,) = [m for _, name, reason, m in api.events if name == "high"]
    assert (
        message
        == "gpuslice: 0/1 nodes fit: 1 preempted 1 lower-priority pod(s) on n; waiting for them to end"
    )


# ---- bind: what is written, and held --------------------------------------------------------------------


def test_bind_writes_the_decision_and_marks_a_failed_binding_in_the_pods_namespace(monkeypatch):
    monkeypatch.setattr(
        state_module,
        "time",
        types.SimpleNamespace(monotonic=state_module.time.monotonic, time=lambda: 1234.5),
    )
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=2)})
    api.pods[("team-b", "p")] = pod_json("p", WHOLE, namespace="team-b")
    assert state.bind("team-b", "p", "uid-p", "n") == ""
    ((namespace, name, written),) = api.patches
    assert (namespace, name) == ("team-b", "p")
    decision = Decision.from_annotations(written)
    assert decision is not None and decision.bind_time == 1234 and decision.containers == ()
    bound = state.cache.pods["uid-p"]
    assert (bound.namespace, bound.name, bound.priority) == ("team-b", "p", 0)
    api.fail_binding = True
    api.pods[("team-b", "q")] = pod_json("q", WHOLE, namespace="team-b")
    assert state.bind("team-b", "q", "uid-q", "n").startswith("binding team-b/q to n failed")
    assert [(ns, n) for ns, n, _ in api.patches] == [("team-b", "p"), ("team-b", "q"), ("team-b", "q")]


def test_a_bound_pod_of_two_containers_holds_both_slices_until_it_goes():
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=1)})
    small = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "10000", "gpuslice.io/gpucores": "10"}
    pod = two_container_pod("p", SHARE_40G, small)
    api.pods[("team-a", "p")] = pod
    assert state.bind("team-a", "p", "uid-p", "n") == ""
    free = state.ledger.view.free_gpu_memory_bytes
    assert free[0, 0] == (81920 - 50000) * 2**20
    state.apply(WatchEvent("Pod", "DELETED", pod))
    assert state.ledger.view.free_gpu_memory_bytes[0, 0] == 81920 * 2**20
    state.check_invariants()


def test_a_retried_bind_on_the_same_node_picks_again_and_takes_a_better_gpu_freed_since():
    """p's earlier bind wrote its decision (GPU 0 of n: GPU 1 was too full) but made no Binding; the
    watch holds it. The big pod on GPU 1 has gone since. kube-scheduler's retried bind of p to n does not
    reuse that hold: it gives it back and picks again, and bestfit packs p next to the small pod on GPU 1."""
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=2)})
    big = {**SHARE, "gpuslice.io/gpumem": "60000"}
    small = {**SHARE, "gpuslice.io/gpumem": "10000"}
    for name, resources in (("big", big), ("small", small)):
        state.apply(WatchEvent("Pod", "ADDED", _bound_pod(name, "n", "1", resources)))
    earlier = Decision("n", "train", (0,), ("GPU-A100-80GB-00",), 20000, 20)
    pod = pod_json("p", SHARE, earlier.to_annotations())
    api.pods[("team-a", "p")] = pod
    state.apply(WatchEvent("Pod", "ADDED", pod))
    assert state.ledger.view.free_gpu_memory_bytes[0, 0] == (81920 - 20000) * 2**20  # the earlier hold
    state.apply(WatchEvent("Pod", "DELETED", _bound_pod("big", "n", "1", big)))
    assert state.bind("team-a", "p", "uid-p", "n") == ""
    ((_, _, written),) = api.patches
    decision = Decision.from_annotations(written)
    assert decision is not None and decision.gpu_indices == (1,)
    free = state.ledger.view.free_gpu_memory_bytes
    assert free[0, :2].tolist() == [81920 * 2**20, (81920 - 30000) * 2**20]
    state.check_invariants()


def test_the_default_policy_and_target_given_are_the_clusters():
    target = TargetWorkload.from_requests([Request(cpu_milli=0, num_gpu=1, gpu_milli=500)])
    state = state_module.ClusterState(FakeApi(), "fgd", narrow=True, target=target)
    assert state.cache.default_policy == "fgd" and state.cache.target is target


def test_deciding_a_mig_pod_counts_the_mig_choices_fallbacks_in_the_clusters_counter(monkeypatch):
    state = make_state(FakeApi(), {n: inventory(gpus=2, mig=SLOTS) for n in ("a", "b")})
    state.narrow = True
    seen = []
    real = state_module.choose_mig_instance

    def recording(candidates, policy=None, fallbacks=None):
        seen.append(fallbacks)
        return real(candidates, policy, fallbacks)

    monkeypatch.setattr(state_module, "choose_mig_instance", recording)
    assert state.filter(pod_json("p", MIG_3G), ["a", "b"]).passed == ["a"]
    assert seen == [state.cache.mig_fallbacks] and seen[0] is state.cache.mig_fallbacks


# ---- the node lock and the invariant check ------------------------------------------------------------


class _FailingBinding(BindingApi):
    """Node locks work; every Binding fails."""

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        raise RuntimeError("500 Internal Server Error")


def test_a_failed_binding_releases_the_node_lock_it_took():
    api = _FailingBinding(delay_s=0.0)
    state = ClusterState(api, default_policy="bestfit", lock_timeout_s=300.0, lock_wait_s=0.5)
    state.apply(node_event("n0", inventory(gpus=1)))
    api.pods[("team-a", "p")] = pod_json("p", WHOLE)
    assert state.bind("team-a", "p", "uid-p", "n0").startswith("binding team-a/p to n0 failed")
    assert api.lock_of("n0") is None


def test_the_invariant_check_finds_a_cached_verdict_that_is_out_of_date():
    state = make_state(FakeApi(), {"a": inventory(gpus=1), "b": inventory(gpus=1)})
    state.filter(pod_json("p", WHOLE), ["a", "b"])
    state.check_invariants()
    built = state.cache.ledgered()
    (cache,) = built.verdicts.values()
    cache.codes[0] = 1 + int(cache.codes[0])  # a cached answer no longer what the ledger says
    with pytest.raises(AssertionError, match=r"outdated verdicts cached for .*: nodes \[0\]"):
        state.check_invariants()


def _locked_state(api: BindingApi) -> ClusterState:
    state = ClusterState(api, default_policy="bestfit", lock_timeout_s=300.0, lock_wait_s=0.25)
    state.apply(node_event("n0", inventory(gpus=1)))
    return state


def test_the_node_lock_takes_the_timeout_and_wait_given_and_names_the_pod_that_holds_it():
    api = BindingApi(delay_s=0.0)
    state = _locked_state(api)
    assert state.bind_locks is not None
    assert (state.bind_locks.timeout_s, state.bind_locks.wait_s) == (300.0, 0.25)
    api.pods[("team-a", "p")] = pod_json("p", WHOLE)
    assert state.bind("team-a", "p", "uid-p", "n0") == ""
    holder = api.lock_of("n0")
    assert holder is not None and (holder.uid, holder.namespace, holder.name) == ("uid-p", "team-a", "p")


def test_a_bind_that_raises_releases_the_node_lock_it_took(monkeypatch):
    api = BindingApi(delay_s=0.0)
    state = _locked_state(api)
    api.pods[("team-a", "p")] = pod_json("p", WHOLE)

    def raising(*args: Any) -> str:
        raise RuntimeError("a bug in bind")

    monkeypatch.setattr(state, "_bind", raising)
    with pytest.raises(RuntimeError, match="a bug in bind"):
        state.bind("team-a", "p", "uid-p", "n0")
    assert api.lock_of("n0") is None


class _BindsDuring(BindingApi):
    """Runs ``during`` once, as pod ``name``'s bind writes its decision: the bind holds its node lock, and
    the API server does not yet show the pod waiting for an allocation."""

    def __init__(self, name: str) -> None:
        super().__init__(delay_s=0.0)
        self.name = name
        self.during: Any = None

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        if name == self.name and self.during is not None:
            during, self.during = self.during, None
            during()
        super().patch_pod_annotations(namespace, name, annotations)


def test_the_node_lock_of_a_pod_whose_bind_still_runs_here_is_live_whatever_the_api_says():
    """The node lock is given the state's bind tracker: while p's bind runs in this process, p's lock
    blocks q although the API server does not yet show p waiting for an allocation (no bind-phase)."""
    api = _BindsDuring("p")
    state = ClusterState(api, default_policy="bestfit", lock_timeout_s=300.0, lock_wait_s=0.05)
    state.apply(node_event("n0", inventory(gpus=2)))
    api.pods[("team-a", "p")] = pod_json("p", WHOLE)
    api.pods[("team-a", "q")] = pod_json("q", WHOLE)
    answers = []
    api.during = lambda: answers.append(state.bind("team-a", "q", "uid-q", "n0"))
    assert state.bind("team-a", "p", "uid-p", "n0") == ""
    (refused,) = answers
    assert refused.startswith("pod team-a/q on n0: node n0 is locked by pod team-a/p, waiting for Allocate")
    holder = api.lock_of("n0")
    assert holder is not None and holder.uid == "uid-p"
    assert "uid-q" not in api.node_of


@pytest.mark.parametrize(("priority", "refused"), [(10, True), (9, True), (11, False)])
def test_a_node_held_for_a_preemptor_refuses_a_pod_of_no_higher_priority(priority, refused):
    api = FakeApi()
    state = make_state(api, {"n": inventory(gpus=2)})
    state.cache.nominations["n"] = Nomination("uid-preemptor", 10, frozenset(), deadline=float("inf"))
    api.pods[("team-a", "p")] = with_priority(pod_json("p", WHOLE), priority)
    error = state.bind("team-a", "p", "uid-p", "n")
    assert (error == f"pod team-a/p on n: {REASON_RESERVED}") is refused
    assert (error == "") is not refused
