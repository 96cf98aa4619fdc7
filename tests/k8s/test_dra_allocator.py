"""gpuslice's DRA allocator over a fake API: the placement policy picks node and GPUs for gated pods'
claims, allocations made by anyone are respected, constraints and node selectors hold, nothing is
over-committed, and a claim nothing fits gets its reason once."""

from __future__ import annotations

import copy
import random
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from gpuslice.k8s.dra.allocator import GATE, ClaimPlacement, DraAllocator, Inventory, claim_ask
from gpuslice.k8s.dra.classes import CLASS_MIG, CLASS_SHARED, CLASS_WHOLE
from gpuslice.k8s.dra.identity import gpu_identities
from gpuslice.k8s.dra.slices import DRIVER, node_slices
from gpuslice.ledger import RefusalCode
from gpuslice.node.discovery import discover
from gpuslice.scheduler.placer import Unplaced
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload


@dataclass
class FakeApi:
    slices: list[dict[str, Any]] = field(default_factory=list)
    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def add_node(self, name: str, simulate: str) -> None:
        machine = discover(simulate)
        self.slices += node_slices(machine, name, generation=1, identities=gpu_identities(machine))

    def add(
        self, name: str, spec: dict[str, Any], node: str = "", gated: bool = True, priority: int = 0
    ) -> None:
        self.claims[("t", name)] = {
            "metadata": {"namespace": "t", "name": name, "uid": f"c-{name}"},
            "spec": spec,
        }
        pod_spec: dict[str, Any] = {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "priority": priority,
        }
        if gated:
            pod_spec["schedulingGates"] = [{"name": GATE}]
        if node:
            pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        meta = {
            "namespace": "t",
            "name": name,
            "uid": f"p-{name}",
            "creationTimestamp": f"{len(self.pods):06d}",
        }
        self.pods.append({"metadata": meta, "spec": pod_spec})

    def list_slices(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.slices)

    def list_claims(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.claims.values()))

    def list_pods(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append(name)
        self.pods = [p for p in self.pods if p["metadata"]["uid"] != uid]

    def write_allocation(self, claim: Mapping[str, Any], allocation: Mapping[str, Any]) -> None:
        stored = self.claims[(claim["metadata"]["namespace"], claim["metadata"]["name"])]
        assert not stored.get("status", {}).get("allocation"), "allocated twice"
        pod = next(p for p in self.pods if p["metadata"]["name"] == claim["metadata"]["name"])
        reserved = [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]
        stored["status"] = {"allocation": copy.deepcopy(dict(allocation)), "reservedFor": reserved}

    def ungate(self, pod: Mapping[str, Any], gate: str) -> None:
        for p in self.pods:
            if p["metadata"]["uid"] == pod["metadata"]["uid"]:
                p["spec"]["schedulingGates"] = [g for g in p["spec"]["schedulingGates"] if g["name"] != gate]

    def pod_event(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        self.events.append((pod["metadata"]["name"], message))

    def delete(self, name: str) -> None:
        del self.claims[("t", name)]
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]

    def results(self, name: str) -> list[dict[str, Any]]:
        return (
            self.claims[("t", name)]
            .get("status", {})
            .get("allocation", {})
            .get("devices", {})
            .get("results", [])
        )

    def gated(self, name: str) -> bool:
        pod = next(p for p in self.pods if p["metadata"]["name"] == name)
        return bool(pod["spec"].get("schedulingGates"))


def spec(
    device_class: str,
    count: int = 1,
    capacity: Mapping[str, str] | None = None,
    match: str = "",
    selectors: list[str] | None = None,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if capacity:
        exactly["capacity"] = {"requests": dict(capacity)}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if match:
        devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": match}]
    return {"devices": devices}


def q(value: str) -> Decimal:
    return Decimal(parse_quantity(value))


def test_a_share_gets_node_gpu_share_id_and_consumed_capacity_and_is_ungated() -> None:
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add("s", spec(CLASS_SHARED, capacity={"memory": "10Gi", "cores": "30"}))
    assert DraAllocator(api).run_once() == 1
    (r,) = api.results("s")
    assert r["driver"] == DRIVER and r["pool"] == "a" and r["device"].startswith("gpu-") and r["shareID"]
    assert q(r["consumedCapacity"]["memory"]) == 10 * 2**30 and r["consumedCapacity"]["cores"] == "30"
    allocation = api.claims[("t", "s")]["status"]["allocation"]
    assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["a"]
    assert allocation["devices"]["config"][0]["opaque"]["parameters"]["exclusive"] is False
    assert not api.gated("s")


def test_a_shares_memory_is_rounded_up_to_the_256_mib_step_never_down() -> None:
    """The request policy's valid values are 256 MiB steps from 256 MiB: an ask between two steps gets the
    step above (what the kubelet's device sees), never less than it asked for."""
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    for name, asked, given in (("s1", "300Mi", 512), ("s2", "100Mi", 256), ("s3", "768Mi", 768),
                               ("s4", "1025Mi", 1280)):  # fmt: skip
        api.add(name, spec(CLASS_SHARED, capacity={"memory": asked, "cores": "10"}))
        assert DraAllocator(api).run_once() == 1
        (r,) = api.results(name)
        assert q(r["consumedCapacity"]["memory"]) == given * 2**20, (asked, r["consumedCapacity"])


def test_bestfit_packs_shares_onto_one_gpu_where_first_fit_would_too_but_respects_what_is_taken() -> None:
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    # gpu-0 taken whole by someone else (kube-scheduler's own allocation, say)
    api.claims[("t", "other")] = {
        "metadata": {"namespace": "t", "name": "other", "uid": "o"},
        "spec": spec(CLASS_WHOLE),
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "a", "device": "gpu-0",
             "consumedCapacity": {"memory": "81408Mi", "cores": "100"}}
        ]}}},
    }  # fmt: skip
    for k in range(3):
        api.add(f"s{k}", spec(CLASS_SHARED, capacity={"memory": "10Gi", "cores": "30"}))
    DraAllocator(api, "bestfit").run_once()
    devices = {api.results(f"s{k}")[0]["device"] for k in range(3)}
    assert len(devices) == 1 and "gpu-0" not in devices  # packed, and not onto the taken GPU


def test_whole_gpus_under_a_match_attribute_share_its_value() -> None:
    api = FakeApi()
    api.add_node("p", "pcie-8gpu-2socket")
    for k in range(3):
        api.add(f"w{k}", spec(CLASS_WHOLE))
    api.add("pair", spec(CLASS_WHOLE, count=2, match="resource.kubernetes.io/pcieRoot"))
    DraAllocator(api).run_once()
    roots = {
        d["name"]: d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"]
        for s in api.slices
        for d in s["spec"].get("devices", [])
    }
    pair = [r["device"] for r in api.results("pair")]
    singles = {api.results(f"w{k}")[0]["device"] for k in range(3)}
    assert len(set(pair)) == 2 and len({roots[d] for d in pair}) == 1 and not singles & set(pair)
    for r in api.results("pair"):
        assert r["consumedCapacity"]["cores"] == "100"


def test_the_pods_node_selector_is_honoured() -> None:
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add_node("b", "dgx-h100")
    api.add("s", spec(CLASS_SHARED, capacity={"memory": "1Gi", "cores": "5"}), node="b")
    DraAllocator(api).run_once()
    assert api.results("s")[0]["pool"] == "b"


def test_claims_gpuslice_does_not_decide_are_ungated_unallocated() -> None:
    api = FakeApi()
    api.add_node("m", "dgx-h100:mig")
    api.add("mig", spec(CLASS_MIG))
    api.add("picky", spec(CLASS_SHARED, selectors=['device.attributes["gpu.gpuslice.io"].index == 3']))
    assert claim_ask(api.claims[("t", "mig")]) is None and claim_ask(api.claims[("t", "picky")]) is None
    assert DraAllocator(api).run_once() == 2
    assert api.results("mig") == [] and not api.gated("mig") and not api.gated("picky")


def test_a_claim_nothing_fits_keeps_its_gate_and_gets_the_reason_once() -> None:
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add("huge", spec(CLASS_SHARED, capacity={"memory": "4Ti", "cores": "10"}))
    api.add("greedy", spec(CLASS_SHARED, capacity={"cores": "250"}))
    allocator = DraAllocator(api)
    allocator.run_once()
    allocator.run_once()
    assert api.gated("huge") and api.gated("greedy") and api.results("huge") == []
    messages = dict(api.events)
    assert len(api.events) == 2  # each reason posted once, not every pass
    assert "0/1 nodes fit" in messages["huge"] and "GPU memory" in messages["huge"]
    assert "cores at most 100" in messages["greedy"]


def test_a_claim_nothing_fits_is_refused_with_the_fit_rules_codes_counted_over_the_nodes() -> None:
    """The allocator's refusal is the record every home reads: the fit rule's code per node, counted,
    with no node left out and none judged twice; a placement is typed too (node, GPUs, MiB, cores)."""
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add_node("b", "dgx-h100")
    api.add("huge", spec(CLASS_SHARED, capacity={"memory": "4Ti", "cores": "10"}))
    api.add("small", spec(CLASS_SHARED, capacity={"memory": "1Gi", "cores": "10"}))
    inventory = Inventory(api.list_slices(), [], "bestfit")
    huge, small = (claim_ask(api.claims[("t", name)]) for name in ("huge", "small"))
    assert huge is not None and small is not None
    refused = inventory.place(huge, None)
    assert isinstance(refused, Unplaced)
    assert refused.node_count == 2 and refused.reasons == Counter({RefusalCode.INSUFFICIENT_GPU_MEMORY: 2})
    placed = inventory.place(small, None)
    assert isinstance(placed, ClaimPlacement) and placed.node in ("a", "b")
    assert len(placed.gpus) == 1 and (placed.memory_mib, placed.cores) == (1024, 10)


def test_no_over_commit_over_a_stream_with_deletions() -> None:
    rng = random.Random(3)
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add_node("b", "pcie-8gpu-2socket")
    allocator = DraAllocator(api, "dotprod")
    live: list[str] = []
    for k in range(300):
        if rng.random() < 0.2:
            api.add(f"c{k}", spec(CLASS_WHOLE, count=rng.choice([1, 2])))
        else:
            memory = rng.choice(["1Gi", "6Gi", "12Gi", "30Gi"])
            api.add(
                f"c{k}",
                spec(CLASS_SHARED, capacity={"memory": memory, "cores": rng.choice(["5", "20", "60"])}),
            )
        live.append(f"c{k}")
        if k % 4 == 3:
            allocator.run_once()
            done = [n for n in live if api.results(n)]
            for gone in rng.sample(done, k=min(2, len(done))):
                api.delete(gone)
                live.remove(gone)
    allocator.run_once()
    capacity = {}
    for s in api.slices:
        for d in s["spec"].get("devices", []):
            for key, cap in d["capacity"].items():
                capacity[(s["spec"]["pool"]["name"], d["name"], key)] = q(cap["value"])
    used: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
    for c in api.claims.values():
        for r in c.get("status", {}).get("allocation", {}).get("devices", {}).get("results", []):
            for key, value in r["consumedCapacity"].items():
                used[(r["pool"], r["device"], key)] += q(value)
    assert used and allocator.decided > 100
    assert all(v <= capacity[k] for k, v in used.items()), [k for k, v in used.items() if v > capacity[k]]


def _four_holders() -> tuple[FakeApi, DraAllocator]:
    """One 4-GPU node whose GPUs are held whole by pods of priority 10, 20, 30 and 40 (low0..low3)."""
    api = FakeApi()
    api.add_node("a", "pcie-4x-l4")
    for k in range(4):
        api.add(f"low{k}", spec(CLASS_WHOLE), priority=10 * (k + 1))
    allocator = DraAllocator(api)
    allocator.run_once()
    assert all(api.results(f"low{k}") for k in range(4))
    return api, allocator


def test_a_higher_priority_claim_preempts_the_cheapest_lower_priority_holders() -> None:
    api, allocator = _four_holders()
    api.add("vip", spec(CLASS_WHOLE, count=2), priority=35)
    allocator.run_once()
    # the two least important holders go (10 and 20), never the one above the pod's priority (40)
    assert sorted(api.deleted) == ["low0", "low1"] and allocator.preemptions == 2
    assert api.gated("vip") and "preempted 2 lower-priority pod(s) on a" in dict(api.events)["vip"]
    allocator.run_once()  # their claims are still allocated: the pod waits, nothing more is evicted
    assert sorted(api.deleted) == ["low0", "low1"]
    for gone in ("low0", "low1"):  # the resource claim controller frees the victims' claims
        del api.claims[("t", gone)]
    allocator.run_once()
    assert not api.gated("vip") and len(api.results("vip")) == 2


def test_a_second_preemptor_never_evicts_the_pods_going_already() -> None:
    """Claims whose pods were deleted for one pod are no victims for the next: it evicts others, or none."""
    api, allocator = _four_holders()
    api.add("vip", spec(CLASS_WHOLE), priority=100)
    allocator.run_once()
    assert api.deleted == ["low0"]
    api.add("next", spec(CLASS_WHOLE), priority=100)
    allocator.run_once()
    assert api.deleted == ["low0", "low1"] and allocator.preemptions == 2  # not low0 a second time


def test_no_preemption_for_equal_or_lower_priority() -> None:
    api = FakeApi()
    api.add_node("a", "pcie-4x-l4")
    for k in range(4):
        api.add(f"w{k}", spec(CLASS_WHOLE), priority=50)
    allocator = DraAllocator(api)
    allocator.run_once()
    api.add("same", spec(CLASS_WHOLE), priority=50)
    allocator.run_once()
    assert api.deleted == [] and api.gated("same")


def _fgd_choice(target: TargetWorkload | None) -> list[tuple[str, str]]:
    """Where fgd puts a 50-core share on two 4-GPU nodes holding shares of 30 (a) and 20 + 20 (b)."""
    api = FakeApi()
    for node in ("a", "b"):
        api.add_node(node, "pcie-4x-l4")
    for i, (node, cores) in enumerate([("a", "30"), ("b", "20"), ("b", "20")]):
        api.add(f"h{i}", spec(CLASS_SHARED, capacity={"memory": "2Gi", "cores": cores}), node=node)
    DraAllocator(api, "fgd").run_once()
    api.add("x", spec(CLASS_SHARED, capacity={"memory": "2Gi", "cores": "50"}))
    DraAllocator(api, "fgd", target).run_once()
    return [(r["pool"], r["device"]) for r in api.results("x")]


def test_fgd_keeps_room_for_the_target_workload_it_is_given() -> None:
    def shapes(*milli: int) -> TargetWorkload:
        return TargetWorkload.from_requests([Request(0, num_gpu=1, gpu_milli=m) for m in milli])

    # The target decides: whole GPUs to come, or 0.7-GPU shares, put the same share elsewhere.
    assert _fgd_choice(shapes(1000)) == [("a", "gpu-0")]
    assert _fgd_choice(shapes(700)) == [("b", "gpu-0")]
    # Without one, the target is the claims allocated so far (as the extender's is the pods bound).
    assert _fgd_choice(None) == _fgd_choice(shapes(300, 200, 200)) == [("b", "gpu-1")]


def test_a_claim_made_from_a_template_is_found_through_the_pods_status() -> None:
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add("t1", spec(CLASS_SHARED, capacity={"memory": "4Gi", "cores": "30"}))
    pod = api.pods[-1]
    pod["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimTemplateName": "gpuslice-share-4096mi-30c"}
    ]
    assert DraAllocator(api).run_once() == 0  # kube-controller-manager has not made the claim yet
    pod["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "t1"}]}
    assert DraAllocator(api).run_once() == 1
    assert [r["pool"] for r in api.results("t1")] == ["a"] and not api.gated("t1")
