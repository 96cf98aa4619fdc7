"""gpuslice's DRA allocator over a fake API: the placement policy picks node and GPUs for gated pods'
claims, allocations made by anyone are respected, constraints and node selectors hold, nothing is
over-committed, and a claim nothing fits gets its reason once."""

from __future__ import annotations

import copy
import logging
import random
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from kubernetes.utils import parse_quantity

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.node import MAX_GPUS_PER_NODE
from gpuslice.k8s.dra.allocator import GATE, ClaimPlacement, DraAllocator, Inventory
from gpuslice.k8s.dra.claim_ask import ClaimAsk, claim_ask
from gpuslice.k8s.dra.classes import CLASS_MIG, CLASS_SHARED, CLASS_WHOLE
from gpuslice.k8s.dra.identity import gpu_identities
from gpuslice.k8s.dra.preempt import Holder
from gpuslice.k8s.dra.slices import DRIVER, node_slices
from gpuslice.ledger import RefusalCode
from gpuslice.ledger.placement import Refusal
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
    reasons: list[str] = field(default_factory=list)  # each event's reason, as events
    event_objects: list[tuple[str, str, str]] = field(default_factory=list)

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
        # as the API server: by namespace and name, with the UID as a precondition
        if not any(
            p["metadata"] == {**p["metadata"], "namespace": namespace, "name": name, "uid": uid}
            for p in self.pods
        ):
            raise LookupError(f"404/409: no pod {namespace}/{name} with UID {uid}")
        self.deleted.append(name)
        self.pods = [p for p in self.pods if p["metadata"]["uid"] != uid]

    def write_allocation(self, claim: Mapping[str, Any], allocation: Mapping[str, Any]) -> None:
        stored = self.claims[(claim["metadata"]["namespace"], claim["metadata"]["name"])]
        assert not stored.get("status", {}).get("allocation"), "allocated twice"
        name = claim["metadata"]["name"]
        pod = next(  # the pod that names the claim: in its spec, or in its status (made from a template)
            p
            for p in self.pods
            if any(r.get("resourceClaimName") == name for r in p["spec"]["resourceClaims"])
            or any(
                r.get("resourceClaimName") == name
                for r in p.get("status", {}).get("resourceClaimStatuses", [])
            )
        )
        reserved = [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]
        stored["status"] = {"allocation": copy.deepcopy(dict(allocation)), "reservedFor": reserved}

    def ungate(self, pod: Mapping[str, Any], gate: str) -> None:
        for p in self.pods:
            if p["metadata"]["uid"] == pod["metadata"]["uid"]:
                p["spec"]["schedulingGates"] = [g for g in p["spec"]["schedulingGates"] if g["name"] != gate]

    def pod_event(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        meta = pod["metadata"]  # the Event's object: namespace, name and UID (DraApi.pod_event)
        self.events.append((meta["name"], message))
        self.reasons.append(reason)
        self.event_objects.append((meta["namespace"], meta["name"], meta["uid"]))

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
    # with the amounts of the node it came closest on: the first, as both are empty H100s
    assert refused.closest is not None and refused.closest_node == "a"
    assert refused.closest.amounts == "need 4 TiB, free 79.6 GiB of 79.6 GiB GPU memory", refused.closest
    assert str(refused).endswith("; closest: a (need 4 TiB, free 79.6 GiB of 79.6 GiB GPU memory)")
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


def _claim(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "t", "name": "c", "uid": "c"}, "spec": spec}


def test_claim_ask_reads_count_memory_cores_class_and_match_attribute() -> None:
    shared = spec(
        CLASS_SHARED, count=2, capacity={"memory": "1536Ki", "cores": "30"}, match="gpu.gpuslice.io/uuid"
    )
    assert claim_ask(_claim(shared)) == ClaimAsk("gpu", 2, 2, 30, False, "gpu.gpuslice.io/uuid")
    # no memory asked: all of it (0); no cores: the whole GPU's; no count: one; no constraint: no attribute
    bare = spec(CLASS_WHOLE)
    del bare["devices"]["requests"][0]["exactly"]["count"]
    assert claim_ask(_claim(bare)) == ClaimAsk("gpu", 1, 0, 100, True, "")
    explicit = spec(CLASS_SHARED, capacity={"cores": "5"})
    explicit["devices"]["requests"][0]["exactly"]["allocationMode"] = "ExactCount"
    explicit["devices"]["constraints"] = [{"requests": ["gpu"]}]  # a constraint that names nothing
    assert claim_ask(_claim(explicit)) == ClaimAsk("gpu", 1, 0, 5, False, "")


def _undecided() -> dict[str, dict[str, Any]]:
    """Claims gpuslice leaves to kube-scheduler's own allocator, by why."""
    cases: dict[str, dict[str, Any]] = {}
    cases["no spec"] = {}
    cases["no requests"] = {"devices": {"requests": []}}
    two = spec(CLASS_SHARED)
    two["devices"]["requests"].append({"name": "more", "exactly": {"deviceClassName": CLASS_SHARED}})
    cases["two requests"] = two
    configured = spec(CLASS_SHARED)
    configured["devices"]["config"] = [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {}}}]
    cases["its own config"] = configured
    cases["first available"] = {"devices": {"requests": [{"name": "gpu", "firstAvailable": []}]}}
    cases["another class"] = spec("gpu.example.com")
    cases["a selector"] = spec(CLASS_WHOLE, selectors=["true"])
    every = spec(CLASS_WHOLE)
    every["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"
    cases["all devices"] = every
    admin = spec(CLASS_SHARED)
    admin["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    cases["admin access"] = admin
    cases["another capacity"] = spec(CLASS_SHARED, capacity={"memory": "1Gi", "bandwidth": "1"})
    distinct = spec(CLASS_WHOLE, count=2)
    distinct["devices"]["constraints"] = [{"requests": ["gpu"], "distinctAttribute": "gpu.gpuslice.io/uuid"}]
    cases["distinct attribute"] = distinct
    twice = spec(CLASS_WHOLE, count=2, match="resource.kubernetes.io/pcieRoot")
    twice["devices"]["constraints"].append(
        {"requests": ["gpu"], "matchAttribute": "gpu.gpuslice.io/numaNode"}
    )
    cases["two constraints"] = twice
    return cases


@pytest.mark.parametrize("case", sorted(_undecided()))
def test_claims_gpuslice_does_not_decide_are_left_to_kube_scheduler(case: str) -> None:
    assert claim_ask(_claim(_undecided()[case])) is None


@pytest.mark.parametrize(
    ("capacity", "named"),
    [({"memory": "lots"}, "request gpu: capacity memory"), ({"cores": "2.5"}, "request gpu: capacity cores")],
)
def test_a_capacity_no_one_can_allocate_is_refused_naming_the_request_and_the_capacity(
    capacity, named
) -> None:
    with pytest.raises(InvalidRequest, match=named):
        claim_ask(_claim(spec(CLASS_SHARED, capacity=capacity)))


def _slice(pool: str, generation: int, devices: list[dict[str, Any]], driver: str = DRIVER) -> dict[str, Any]:
    return {"spec": {"driver": driver, "pool": {"name": pool, "generation": generation}, "devices": devices}}


def _device(
    name: str, mib: int = 1024, kind: str = "gpu", shared: bool = True, **attributes: Any
) -> dict[str, Any]:
    attrs = {"type": {"string": kind}, **{k: {"string": v} for k, v in attributes.items()}}
    return {
        "name": name,
        "attributes": attrs,
        "allowMultipleAllocations": shared,
        "capacity": {"memory": {"value": f"{mib}Mi"}, "cores": {"value": "100"}},
    }


def test_the_inventory_holds_the_newest_generation_of_each_pool_and_only_shared_gpus_of_this_driver() -> None:
    slices = [
        _slice("b", 2, [_device("gpu-1", 2048), _device("gpu-0", 4096)]),
        _slice("b", 2, [_device("mig-0", kind="mig"), _device("gpu-2", shared=False)]),
        _slice("b", 1, [_device("gpu-9")]),  # an old generation of pool b, listed after the new one: gone
        _slice("a", 3, [_device("gpu-0", 512)]),
        _slice("a", 3, [_device("gpu-7")], driver="gpu.example.com"),  # another driver's pool of node a
        _slice("c", 1, [_device("gpu-0")], driver="gpu.example.com"),  # another driver's pool
        _slice(
            "d", 1, [_device(f"gpu-{k:02d}") for k in range(MAX_GPUS_PER_NODE + 1)]
        ),  # no node has that many
        _slice("e", 1, [_device("mig-0", kind="mig")]),  # no shared GPU: no node
    ]
    inventory = Inventory(slices, [], "bestfit")
    assert inventory.nodes == ["a", "b"]
    assert [[(g.device, g.memory_mib) for g in gs] for gs in inventory.gpus] == [
        [("gpu-0", 512)],
        [("gpu-0", 4096), ("gpu-1", 2048)],  # by device name
    ]
    assert inventory.ledger is not None and inventory.ledger.node_count == 2
    assert inventory.free(1) == ([1000, 1000], [4096 * 2**20, 2048 * 2**20], [4096 * 2**20, 2048 * 2**20])


def test_an_inventory_of_no_node_places_nothing_and_preempts_nothing() -> None:
    inventory = Inventory([_slice("c", 1, [_device("gpu-0")], driver="gpu.example.com")], [], "bestfit")
    assert inventory.nodes == [] and inventory.ledger is None
    ask = ClaimAsk("gpu", 1, 0, 100, True)
    unplaced = inventory.place(ask, None)
    assert isinstance(unplaced, Unplaced) and unplaced.node_count == 0 and DRIVER in unplaced.note
    assert inventory.preemption([ask], 100, None) is None


def _allocated(
    uid: str, results: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "t", "name": uid, "uid": uid},
        "status": {"allocation": {"devices": {"results": results}}, "reservedFor": pods or []},
    }


def _result(device: str, pool: str = "a", driver: str = DRIVER, **consumed: str) -> dict[str, Any]:
    return {"request": "gpu", "driver": driver, "pool": pool, "device": device, "consumedCapacity": consumed}


def test_allocated_claims_are_reserved_and_held_by_their_pods_at_their_highest_priority() -> None:
    slices = [_slice("a", 1, [_device("gpu-0", 4096), _device("gpu-1", 4096)])]
    claims = [
        _allocated(
            "shared",
            [_result("gpu-0", memory="1Gi", cores="30")],
            [
                {"resource": "pods", "name": "p1", "uid": "u1"},
                {"resource": "pods", "name": "p2", "uid": "u2"},
                {"resource": "jobs", "name": "j", "uid": "u3"},  # not a pod: never preempted
            ],
        ),
        _allocated("whole", [_result("gpu-1")]),  # no consumedCapacity: the whole GPU
        _allocated("elsewhere", [_result("gpu-0", pool="z"), _result("gpu-0", driver="gpu.example.com")]),
        {"metadata": {"namespace": "t", "name": "pending", "uid": "pending"}},
    ]
    inventory = Inventory(slices, claims, "bestfit", priorities={"u1": 5, "u2": 7, "u3": 99})
    assert inventory.free(0) == ([700, 0], [3 * 2**30, 0], [4 * 2**30, 4 * 2**30])
    assert inventory.holders == [
        Holder("shared", 0, (0,), 300, 2**30, (("t", "p1", "u1"), ("t", "p2", "u2")), 7),
        Holder("whole", 0, (1,), 1000, 4 * 2**30, (), 0),
    ]
    assert inventory.shapes == [Request(0, num_gpu=1, gpu_milli=300), Request(0, num_gpu=1, gpu_milli=1000)]


def test_claims_allocated_beyond_a_gpus_capacity_are_logged(caplog) -> None:
    slices = [_slice("a", 1, [_device("gpu-0", 4096)])]
    claims = [_allocated(f"c{k}", [_result("gpu-0", memory="3Gi", cores="50")]) for k in range(2)]
    with caplog.at_level(logging.ERROR, logger="gpuslice.k8s.dra.allocator"):
        inventory = Inventory(slices, claims, "bestfit")
    assert [r.getMessage() for r in caplog.records] == ["claims allocated on a gpu-0 exceed its capacity"]
    assert len(inventory.holders) == 2


def test_the_request_of_a_whole_gpu_a_share_and_a_share_without_memory() -> None:
    inventory = Inventory([_slice("a", 1, [_device("gpu-0", 4096), _device("gpu-1", 8192)])], [], "bestfit")
    assert inventory.request(ClaimAsk("gpu", 1, 1000, 30, True)) == Request(0, num_gpu=1, gpu_milli=1000)
    assert inventory.request(ClaimAsk("gpu", 2, 1000, 30, False)) == Request(0, num_gpu=2, gpu_milli=1000)
    assert inventory.request(ClaimAsk("gpu", 1, 1000, 30, False)) == Request(
        0, num_gpu=1, gpu_milli=300, gpu_memory_bytes=1024 * 2**20
    )
    # a share that names no memory asks for the biggest GPU's: it fits a GPU only while that one is free
    assert inventory.request(ClaimAsk("gpu", 1, 0, 100, False)) == Request(
        0, num_gpu=1, gpu_milli=1000, gpu_memory_bytes=8192 * 2**20
    )


@pytest.mark.parametrize(
    "ask",
    [ClaimAsk("gpu", 0, 0, 10, False), ClaimAsk("gpu", 1, -1, 10, False), ClaimAsk("gpu", 1, 0, 0, False),
     ClaimAsk("gpu", 1, 0, 101, False)],
    ids=["no GPU", "negative memory", "no cores", "over 100 cores"],
)  # fmt: skip
def test_an_ask_no_gpu_could_serve_is_refused_and_never_preempts(ask: ClaimAsk) -> None:
    inventory = Inventory([_slice("a", 1, [_device("gpu-0")])], [], "bestfit")
    with pytest.raises(InvalidRequest, match="count, memory and cores must be positive"):
        inventory.place(ask, None)
    assert inventory.preemption([ask], 100, None) is None
    assert inventory.request(ClaimAsk("gpu", 1, 0, 100, False)).gpu_milli == 1000  # 100 cores: the edge


def test_a_node_selector_no_node_matches_is_said_after_the_fit_rules_counts() -> None:
    inventory = Inventory([_slice("a", 1, [_device("gpu-0")])], [], "bestfit")
    unplaced = inventory.place(ClaimAsk("gpu", 1, 256, 10, False), "nowhere")
    assert isinstance(unplaced, Unplaced) and not unplaced.reasons
    assert str(unplaced) == "0/1 nodes fit: the pod's node selector or the claim's constraint"
    placed = inventory.place(ClaimAsk("gpu", 1, 256, 10, False), "a")
    assert isinstance(placed, ClaimPlacement) and placed.node == "a"


def test_a_match_attribute_of_the_driver_is_read_by_its_short_name_and_the_tightest_group_is_used() -> None:
    # two GPUs under root x, three under root y, one with no root; a pair goes to x, the tighter group
    devices = [_device("gpu-0", root="x"), _device("gpu-1", root="y"), _device("gpu-2", root="x"),
               _device("gpu-3", root="y"), _device("gpu-4", root="y"), _device("gpu-5")]  # fmt: skip
    for match in (f"{DRIVER}/root", "root"):
        inventory = Inventory([_slice("a", 1, devices)], [], "bestfit")
        placed = inventory.place(ClaimAsk("gpu", 2, 0, 100, True, match), None)
        assert isinstance(placed, ClaimPlacement)
        assert [g.device for g in placed.gpus] == ["gpu-0", "gpu-2"], match
        # three more: only y has three GPUs
        placed = inventory.place(ClaimAsk("gpu", 3, 0, 100, True, match), None)
        assert isinstance(placed, ClaimPlacement)
        assert [g.device for g in placed.gpus] == ["gpu-1", "gpu-3", "gpu-4"], match
    # an attribute of another domain is read by its full name: none of these GPUs has one
    inventory = Inventory([_slice("a", 1, devices)], [], "bestfit")
    unplaced = inventory.place(ClaimAsk("gpu", 1, 0, 100, True, "example.com/root"), None)
    assert isinstance(unplaced, Unplaced) and "claim's constraint" in str(unplaced)


def test_an_allocation_names_the_class_config_the_node_and_the_time_it_was_made() -> None:
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add("w", spec(CLASS_WHOLE))
    api.add("s", spec(CLASS_SHARED, capacity={"cores": "10"}))
    DraAllocator(api).run_once()
    for name, exclusive in (("w", True), ("s", False)):
        allocation = api.claims[("t", name)]["status"]["allocation"]
        (config,) = allocation["devices"]["config"]
        assert config["source"] == "FromClass" and config["requests"] == ["gpu"]
        assert (
            config["opaque"]["driver"] == DRIVER and config["opaque"]["parameters"]["exclusive"] is exclusive
        )
        (term,) = allocation["nodeSelector"]["nodeSelectorTerms"]
        assert term == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", allocation["allocationTimestamp"])
        (r,) = api.results(name)
        assert r["request"] == "gpu"
        # no memory named: the request policy's default (all of the GPU, on a 256 MiB step)
        assert r["consumedCapacity"]["memory"] == "81408Mi"
    assert api.results("w")[0]["consumedCapacity"]["cores"] == "100"
    assert api.results("s")[0]["consumedCapacity"]["cores"] == "10"
    assert api.results("w")[0]["shareID"] != api.results("s")[0]["shareID"]


def test_gated_pods_are_decided_oldest_first_then_by_name_and_pods_without_the_gate_are_left_alone() -> None:
    api = FakeApi()
    api.slices = [_slice("a", 1, [_device("gpu-0")])]
    api.add("free", spec(CLASS_WHOLE), gated=False)  # kube-scheduler's to decide, not gpuslice's
    api.add("other", spec(CLASS_WHOLE))
    api.pods[-1]["spec"]["schedulingGates"] = [{"name": "someone-else"}]
    allocator = DraAllocator(api)
    assert allocator.run_once() == 0 and api.results("free") == api.results("other") == []
    api.pods = []
    api.add("a-young", spec(CLASS_WHOLE))
    api.add("z-old", spec(CLASS_WHOLE))  # older, though after the other by name
    del api.pods[-1]["metadata"]["creationTimestamp"]  # none: older than any
    api.pods[-1]["spec"]["schedulingGates"].insert(0, {"name": "someone-else"})
    assert allocator.run_once() == 1  # the oldest got the GPU; the other keeps its gate
    assert api.results("z-old") and not api.results("a-young") and api.gated("a-young")
    assert [p["spec"]["schedulingGates"] for p in api.pods if p["metadata"]["name"] == "z-old"] == [
        [{"name": "someone-else"}]  # only gpuslice's gate is removed
    ]
    api.claims.clear()
    api.pods = []
    api.add("a-young", spec(CLASS_WHOLE))
    api.add("z-old", spec(CLASS_WHOLE))
    api.pods[0]["metadata"]["creationTimestamp"] = "2026-12-04T10:00:01Z"
    api.pods[1]["metadata"]["creationTimestamp"] = "2026-12-04T10:00:00Z"
    allocator.run_once()
    assert api.results("z-old") and not api.results("a-young")
    api.claims.clear()
    api.pods = []
    api.add("b", spec(CLASS_WHOLE))
    api.add("a", spec(CLASS_WHOLE))
    for pod in api.pods:
        pod["metadata"]["creationTimestamp"] = "2026-12-04T10:00:00Z"
    allocator.run_once()
    assert api.results("a") and not api.results("b")  # the same age: by name


def test_a_pod_whose_claims_are_allocated_already_is_ungated_without_a_decision() -> None:
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.claims[("t", "mine")] = _allocated("mine", [_result("gpu-3")])
    api.claims[("t", "mine")]["spec"] = spec(CLASS_WHOLE)
    api.pods.append(
        {
            "metadata": {"namespace": "t", "name": "p", "uid": "p"},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "mine"}],
                "schedulingGates": [{"name": GATE}],
            },
        }
    )
    allocator = DraAllocator(api)
    assert allocator.run_once() == 1 and allocator.decided == 0 and not api.gated("p")
    assert api.results("mine") == [_result("gpu-3")]


def _two_claim_pod(api: FakeApi, first: dict[str, Any], second: dict[str, Any], name: str = "p") -> None:
    """A gated pod with two claims for gpuslice (one per asking container, as the webhook writes them)."""
    api.add(f"{name}-0", first)
    api.claims[("t", f"{name}-1")] = {
        "metadata": {"namespace": "t", "name": f"{name}-1", "uid": f"c-{name}-1"},
        "spec": second,
    }
    api.pods[-1]["spec"]["resourceClaims"].append({"name": "gpu-1", "resourceClaimName": f"{name}-1"})


def _pools_a_b_with_a_half_full() -> FakeApi:
    """Two nodes of two GPUs; GPU 0 of node a is held whole, so a is best fit's choice for one GPU."""
    api = FakeApi()
    for pool in ("a", "b"):
        api.slices.append(_slice(pool, 1, [_device("gpu-0", 4096), _device("gpu-1", 4096)]))
    api.claims[("t", "held")] = _allocated("held", [_result("gpu-0")])
    return api


def test_a_pod_with_two_claims_gets_both_on_one_node_where_they_fit_together() -> None:
    """Each claim alone fits node a (best fit's pick: its one free GPU is the tightest), but not both:
    the pod goes to b whole, never one claim on each node, and a's GPU is not held for it."""
    api = _pools_a_b_with_a_half_full()
    _two_claim_pod(api, spec(CLASS_WHOLE), spec(CLASS_WHOLE))
    api.add("next", spec(CLASS_WHOLE))  # decided in the same pass, after: a's GPU must be free for it
    allocator = DraAllocator(api, "bestfit")
    assert allocator.run_once() == 2 and allocator.decided == 3 and not api.gated("p-0")
    placed = [(r["pool"], r["device"]) for name in ("p-0", "p-1") for r in api.results(name)]
    assert sorted(placed) == [("b", "gpu-0"), ("b", "gpu-1")]
    assert [(r["pool"], r["device"]) for r in api.results("next")] == [("a", "gpu-1")]


def test_a_pod_whose_claims_fit_no_node_together_keeps_its_gate_and_no_claim_is_allocated() -> None:
    api = _pools_a_b_with_a_half_full()
    _two_claim_pod(api, spec(CLASS_WHOLE, count=2), spec(CLASS_WHOLE))  # three GPUs on one node: none
    allocator = DraAllocator(api, "bestfit")
    assert allocator.run_once() == 0 and allocator.decided == 0 and api.gated("p-0")
    assert api.results("p-0") == api.results("p-1") == []
    ((pod, message),) = api.events
    assert (
        pod == "p-0" and message == "claims p-0, p-1: 0/2 nodes fit: the pod's 2 claims fit no node together"
    )
    # a claim that fits nowhere even alone is named, with the fit rule's counts
    api.events.clear()
    api.delete("p-0")
    _two_claim_pod(api, spec(CLASS_SHARED, capacity={"cores": "10"}), spec(CLASS_WHOLE, count=3), name="q")
    assert allocator.run_once() == 0 and api.results("q-0") == []
    ((pod, message),) = api.events
    assert pod == "q-0" and message.startswith("claims q-0, q-1: 0/2 nodes fit: 2 ")
    assert message.endswith(": claim 2 of the pod's 2")


def test_a_pod_half_allocated_by_a_write_that_failed_gets_the_rest_on_the_same_node() -> None:
    """The first claim's allocation is written, the second's write fails (an API outage): the pod keeps
    its gate, and the next pass puts the second claim on the first one's node, though the policy alone
    would choose the other."""
    api = FakeApi()
    for pool in ("a", "b"):
        api.slices.append(_slice(pool, 1, [_device("gpu-0", 4096), _device("gpu-1", 4096)]))
    _two_claim_pod(
        api,
        spec(CLASS_SHARED, capacity={"cores": "50", "memory": "1Gi"}),
        spec(CLASS_SHARED, capacity={"cores": "60", "memory": "1Gi"}),
    )
    allocator = DraAllocator(api, "bestfit")
    original = api.write_allocation
    writes = []

    def second_fails(claim: Mapping[str, Any], allocation: Mapping[str, Any]) -> None:
        writes.append(claim["metadata"]["name"])
        if len(writes) == 2:
            raise RuntimeError("the API server answered 500")
        original(claim, allocation)

    api.write_allocation = second_fails  # type: ignore[method-assign]
    assert allocator.run_once() == 0 and api.gated("p-0")
    (first,) = api.results("p-0")
    assert api.results("p-1") == []
    # the next pass: only p-1 is pending; the other node is made the tighter fit for a 60 % share (40 %
    # of one GPU and all of the other held), so best fit alone would choose it
    other = "b" if first["pool"] == "a" else "a"
    api.claims[("t", "fill")] = _allocated(
        "fill", [_result("gpu-0", pool=other, cores="40", memory="1Gi"), _result("gpu-1", pool=other)]
    )
    assert (
        Inventory(api.list_slices(), api.list_claims(), "bestfit")
        .place(ClaimAsk("gpu", 1, 1024, 60, False), None)
        .node
        == other
    )  # type: ignore[union-attr]
    api.write_allocation = original  # type: ignore[method-assign]
    assert allocator.run_once() == 1 and not api.gated("p-0")
    (second,) = api.results("p-1")
    assert second["pool"] == first["pool"]
    # claims already on two nodes cannot be joined: said, and the pod keeps its gate
    api.claims[("t", "p-1")]["status"]["allocation"]["devices"]["results"][0]["pool"] = other
    api.claims[("t", "p-2")] = {
        "metadata": {"namespace": "t", "name": "p-2", "uid": "c-p-2"},
        "spec": spec(CLASS_WHOLE),
    }
    api.pods[-1]["spec"]["resourceClaims"].append({"name": "gpu-2", "resourceClaimName": "p-2"})
    api.pods[-1]["spec"]["schedulingGates"] = [{"name": GATE}]
    assert allocator.run_once() == 0 and api.gated("p-0") and api.results("p-2") == []
    assert api.events[-1] == ("p-0", "its claims are allocated on a, b already: one node only")


def test_a_claim_whose_capacity_is_no_quantity_is_told_once_on_its_pod() -> None:
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add("bad", spec(CLASS_SHARED, capacity={"memory": "lots"}))
    allocator = DraAllocator(api)
    assert allocator.run_once() == 0 and allocator.run_once() == 0
    assert api.gated("bad")
    ((pod, message),) = api.events
    assert pod == "bad" and message.startswith("claim refused: request gpu: capacity memory")


def test_a_pod_the_api_fails_for_is_retried_and_the_others_are_decided(caplog) -> None:
    class Refusing(FakeApi):
        def write_allocation(self, claim: Mapping[str, Any], allocation: Mapping[str, Any]) -> None:
            if claim["metadata"]["name"] == "first":
                raise RuntimeError("409 Conflict")
            super().write_allocation(claim, allocation)

    api = Refusing()
    api.add_node("a", "dgx-h100")
    api.add("first", spec(CLASS_WHOLE))
    api.add("second", spec(CLASS_WHOLE))
    allocator = DraAllocator(api)
    with caplog.at_level(logging.WARNING, logger="gpuslice.k8s.dra.allocator"):
        assert allocator.run_once() == 1
    assert api.gated("first") and not api.gated("second") and allocator.decided == 1
    assert [r.getMessage() for r in caplog.records] == ["pod t/first: 409 Conflict"]


def test_run_passes_until_stopped_and_a_failed_pass_is_logged_and_retried(caplog) -> None:
    stop = threading.Event()

    class Flaky(FakeApi):
        calls = 0

        def list_pods(self) -> list[dict[str, Any]]:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("API server unreachable")
            if self.calls == 3:
                stop.set()
            return super().list_pods()

    api = Flaky()
    api.add_node("a", "dgx-h100")
    api.add("w", spec(CLASS_WHOLE))
    with caplog.at_level(logging.ERROR, logger="gpuslice.k8s.dra.allocator"):
        DraAllocator(api).run(stop, interval_s=0)
    assert api.calls == 3 and api.results("w") and not api.gated("w")
    assert [r.getMessage() for r in caplog.records] == ["DRA allocation pass failed; retrying"]


def test_a_pass_that_ungated_pods_starts_the_next_at_once_and_an_idle_one_waits() -> None:
    class Counting(FakeApi):
        passes = 0

        def list_pods(self) -> list[dict[str, Any]]:
            self.passes += 1
            return super().list_pods()

    class Stop:
        """A stop event that ends the loop at its first wait, and records how long it was asked to wait."""

        def __init__(self) -> None:
            self.waited: list[float] = []

        def is_set(self) -> bool:
            return bool(self.waited)

        def wait(self, timeout: float) -> bool:
            self.waited.append(timeout)
            return True

    api = Counting()
    api.add_node("a", "dgx-h100")
    api.add("w", spec(CLASS_WHOLE))
    stop = Stop()
    DraAllocator(api).run(stop, interval_s=7)  # type: ignore[arg-type]
    assert api.passes == 2 and stop.waited == [7]  # the busy pass went on at once; the idle one waited


def test_preempted_pods_are_told_by_whom_and_the_preemptor_waits_for_them() -> None:
    api, allocator = _four_holders()
    api.add("vip", spec(CLASS_WHOLE), priority=35)
    allocator.run_once()
    assert api.deleted == ["low0"]
    assert api.events[0] == ("low0", "gpuslice: preempted on a by t/vip (priority 35)")
    assert api.event_objects[0] == ("t", "low0", "p-low0")
    assert api.reasons == ["Preempted", "GpusliceUnplaced"]
    assert api.events[1][0] == "vip" and api.events[1][1].endswith(
        "; preempted 1 lower-priority pod(s) on a, waiting for them to end"
    )
    allocator.run_once()  # low0's claim is still allocated: the pod is told it waits, once
    allocator.run_once()
    assert api.deleted == ["low0"] and len(api.events) == 3
    assert api.events[2][1].endswith("; waiting for the pods it preempted to end")


def test_a_preemptor_pinned_to_a_node_preempts_only_there() -> None:
    api = FakeApi()
    api.slices = [_slice("a", 1, [_device("gpu-0")]), _slice("b", 1, [_device("gpu-0")])]
    api.add("low-a", spec(CLASS_WHOLE), node="a", priority=1)
    api.add("low-b", spec(CLASS_WHOLE), node="b", priority=2)
    allocator = DraAllocator(api)
    allocator.run_once()
    api.add("vip", spec(CLASS_WHOLE), node="b", priority=10)
    allocator.run_once()
    assert api.deleted == ["low-b"]  # not the cheaper holder on a: the pod cannot go there
    assert "on b" in dict(api.events)["vip"]


def test_a_pod_that_names_no_priority_preempts_no_pod_that_names_none_either() -> None:
    api = FakeApi()
    api.slices = [_slice("a", 1, [_device("gpu-0")])]
    api.add("first", spec(CLASS_WHOLE))
    allocator = DraAllocator(api)
    allocator.run_once()
    api.add("second", spec(CLASS_WHOLE))
    for pod in api.pods:
        del pod["spec"]["priority"]  # none: 0, as kube-scheduler reads it
    allocator.run_once()
    assert api.deleted == [] and api.gated("second")
    unplaced = Inventory(api.list_slices(), api.list_claims(), "bestfit").place(
        ClaimAsk("gpu", 1, 0, 100, True), None
    )
    assert dict(api.events)["second"] == f"claim second: {unplaced}"  # no word of preemption


def test_a_preemptor_whose_room_was_taken_meanwhile_preempts_again() -> None:
    api, allocator = _four_holders()
    api.add("vip", spec(CLASS_WHOLE), priority=35)
    allocator.run_once()
    assert api.deleted == ["low0"]
    del api.claims[("t", "low0")]  # low0's claim is freed, and someone else's claim takes its GPU first
    taken = {api.results(f"low{k}")[0]["device"] for k in range(1, 4)}
    (free,) = {"gpu-0", "gpu-1", "gpu-2", "gpu-3"} - taken
    api.add("sneak", spec(CLASS_WHOLE), gated=False, priority=100)  # kube-scheduler allocated its claim
    api.claims[("t", "sneak")] = _allocated(
        "sneak", [_result(free)], [{"resource": "pods", "name": "sneak", "uid": "p-sneak"}]
    )
    allocator.run_once()
    assert api.deleted == ["low0", "low1"]  # its first preemption is over: it preempts the next cheapest


def test_a_failed_pass_waits_before_the_next_one() -> None:
    class Down(FakeApi):
        calls = 0

        def list_pods(self) -> list[dict[str, Any]]:
            self.calls += 1
            raise RuntimeError("API server unreachable")

    class Stop:
        """Set at the first wait, or at a second pass (a loop that never waits must still end)."""

        def __init__(self, api: Down) -> None:
            self.api = api
            self.waited: list[float] = []

        def is_set(self) -> bool:
            return bool(self.waited) or self.api.calls >= 2

        def wait(self, timeout: float) -> bool:
            self.waited.append(timeout)
            return True

    api = Down()
    stop = Stop(api)
    DraAllocator(api).run(stop, interval_s=3)  # type: ignore[arg-type]
    assert stop.waited == [3] and api.calls == 1  # not retried at once, in a tight loop


def test_a_reservation_the_ledger_refuses_after_its_mask_said_yes_is_unplaced_naming_the_node(
    monkeypatch,
) -> None:
    inventory = Inventory([_slice("a", 1, [_device("gpu-0")])], [], "bestfit")
    assert inventory.ledger is not None
    broken = Refusal(RefusalCode.INSUFFICIENT_GPU_MEMORY, 0)
    monkeypatch.setattr(inventory.ledger, "reserve", lambda node, gpus, req: broken)
    ask = ClaimAsk("gpu", 1, 0, 100, True)
    unplaced = inventory.place(ask, None)
    assert isinstance(unplaced, Unplaced)
    assert unplaced.request == inventory.request(ask) and unplaced.node_count == 1
    assert unplaced.reasons == Counter({RefusalCode.INSUFFICIENT_GPU_MEMORY: 1}) and unplaced.note == "node a"


def test_a_whole_gpu_is_placed_with_all_its_cores_and_memory_whatever_the_ask_named() -> None:
    inventory = Inventory([_slice("a", 1, [_device(f"gpu-{k}", 4096) for k in range(4)])], [], "bestfit")
    for ask in (ClaimAsk("gpu", 1, 1000, 30, True), ClaimAsk("gpu", 2, 1000, 30, False)):
        placed = inventory.place(ask, None)
        assert isinstance(placed, ClaimPlacement) and (placed.memory_mib, placed.cores) == (0, 100), ask
    share = inventory.place(ClaimAsk("gpu", 1, 1000, 100, False), None)  # all the cores, not all the memory
    assert isinstance(share, ClaimPlacement) and (share.memory_mib, share.cores) == (1024, 100)
    assert inventory.request(ClaimAsk("gpu", 1, 0, 1, False)).gpu_milli == 10  # one core: the least


def test_a_share_without_memory_on_no_node_is_unplaced_not_an_error() -> None:
    inventory = Inventory([], [], "bestfit")
    ask = ClaimAsk("gpu", 1, 0, 30, False)
    unplaced = inventory.place(ask, None)
    assert isinstance(unplaced, Unplaced)
    assert unplaced.request == Request(0, num_gpu=1, gpu_milli=300) == inventory.request(ask)


def test_under_a_match_attribute_the_tighter_group_wins_wherever_it_is_listed() -> None:
    # on node b, root y (three GPUs) comes first by device name; the pair still goes to root x, the
    # tighter one; node a's GPU has no root at all
    devices = [_device("gpu-0", root="y"), _device("gpu-1", root="y"), _device("gpu-2", root="y"),
               _device("gpu-3", root="x"), _device("gpu-4", root="x")]  # fmt: skip
    slices = [_slice("a", 1, [_device("gpu-0")]), _slice("b", 1, devices)]
    inventory = Inventory(slices, [], "bestfit")
    placed = inventory.place(ClaimAsk("gpu", 2, 0, 100, True, "root"), None)
    assert isinstance(placed, ClaimPlacement) and placed.node == "b"
    assert [g.device for g in placed.gpus] == ["gpu-3", "gpu-4"]
    # with two of y's GPUs taken, y is the tighter group for one GPU
    taken = _allocated("c", [_result("gpu-0", pool="b"), _result("gpu-1", pool="b")])
    inventory = Inventory(slices, [taken], "bestfit")
    placed = inventory.place(ClaimAsk("gpu", 1, 0, 100, True, "root"), None)
    assert isinstance(placed, ClaimPlacement) and placed.node == "b"
    assert [g.device for g in placed.gpus] == ["gpu-2"]


def test_the_placement_policy_draws_from_a_generator_seeded_0_as_the_simulator_does() -> None:
    from gpuslice.policies import PolicyContext, make_policy
    from gpuslice.scheduler.placer import Placer

    slices = [_slice(f"n{i}", 1, [_device(f"gpu-{k}", 4096) for k in range(4)]) for i in range(4)]
    asks = [ClaimAsk("gpu", 1, 512, 10 + k, False) for k in range(24)]
    inventory, reference = Inventory(slices, [], "random"), Inventory(slices, [], "random")
    assert reference.ledger is not None
    target = TargetWorkload.from_requests([reference.request(asks[0])])
    context = PolicyContext(np.random.default_rng(0), target=target)
    reference.placer = Placer(reference.ledger, make_policy("random", reference.ledger.view, context))
    decided = [inventory.place(ask, None) for ask in asks]
    expected = [reference.place(ask, None) for ask in asks]
    assert [(p.node, [g.device for g in p.gpus]) for p in decided] == [
        (p.node, [g.device for g in p.gpus]) for p in expected
    ]


def test_the_allocation_timestamp_is_utc_whatever_the_local_time_zone(monkeypatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        api = FakeApi()
        api.add_node("a", "dgx-h100")
        api.add("w", spec(CLASS_WHOLE))
        before = datetime.now(UTC).replace(microsecond=0)
        DraAllocator(api).run_once()
        after = datetime.now(UTC)
    finally:
        monkeypatch.undo()
        time.tzset()
    stamp = api.claims[("t", "w")]["status"]["allocation"]["allocationTimestamp"]
    assert before <= datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) <= after


def test_a_preemption_is_logged_with_the_pod_the_count_and_the_node(caplog) -> None:
    api, allocator = _four_holders()
    api.add("vip", spec(CLASS_WHOLE, count=2), priority=35)
    with caplog.at_level(logging.INFO, logger="gpuslice.k8s.dra.allocator"):
        allocator.run_once()
    assert "pod vip preempted 2 pod(s) on a" in [r.getMessage() for r in caplog.records]


def test_a_pod_of_priority_1_preempts_a_pod_that_names_none() -> None:
    api = FakeApi()
    api.slices = [_slice("a", 1, [_device("gpu-0")])]
    api.add("first", spec(CLASS_WHOLE))
    del api.pods[-1]["spec"]["priority"]  # none: 0
    allocator = DraAllocator(api)
    allocator.run_once()
    api.add("second", spec(CLASS_WHOLE), priority=1)
    allocator.run_once()
    assert api.deleted == ["first"]


def test_an_ask_no_gpu_could_serve_is_told_on_its_pod_and_keeps_its_gate() -> None:
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add("none", spec(CLASS_WHOLE, count=0))
    assert DraAllocator(api).run_once() == 0  # nothing ungated
    assert api.gated("none") and api.reasons == ["GpusliceUnplaced"]
    assert dict(api.events)["none"].startswith("claim none refused: request gpu: count, memory and cores")


def test_two_pods_sharing_one_claim_are_both_ungated_in_one_pass_and_it_is_allocated_once() -> None:
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add("shared", spec(CLASS_SHARED, capacity={"cores": "10"}))
    second = copy.deepcopy(api.pods[-1])
    second["metadata"].update(name="second", uid="p-second", creationTimestamp="999999")
    api.pods.append(second)
    allocator = DraAllocator(api)
    assert allocator.run_once() == 2  # the second pod sees the claim allocated in this pass
    assert allocator.decided == 1 and len(api.results("shared")) == 1
    assert not api.gated("shared") and not api.gated("second")


def test_a_claims_results_are_each_counted_past_another_drivers_and_its_consumption_read_as_allocated() -> (
    None
):
    slices = [_slice("a", 0, [_device(f"gpu-{k}", 4096) for k in range(4)])]  # generation 0: a valid pool
    claims = [
        # another driver's result first, then gpuslice's: both of ours are counted
        _allocated(
            "mixed", [_result("gpu-0", driver="gpu.example.com"), _result("gpu-1", memory="1Gi", cores="1")]
        ),
        _allocated("over", [_result("gpu-2", memory="1Gi", cores="150")]),  # beyond 100 %: the whole GPU
        _allocated(
            "ghost",
            [_result("gpu-3", memory="1Gi", cores="10")],
            [{"resource": "pods", "name": "gone", "uid": "gone"}],
        ),
    ]
    inventory = Inventory(slices, claims, "bestfit", priorities={})
    assert inventory.nodes == ["a"]
    assert inventory.free(0)[0] == [1000, 990, 0, 900]  # one core is 10 milli; 150 cores all 1000
    assert [(h.claim_uid, h.gpus, h.milli, h.priority) for h in inventory.holders] == [
        ("mixed", (1,), 10, 0),
        ("over", (2,), 1000, 0),
        ("ghost", (3,), 100, 0),  # a pod no longer listed has priority 0
    ]


def test_each_decision_is_logged_with_the_claim_the_node_and_the_gpus(caplog) -> None:
    api = FakeApi()
    api.slices = [_slice("a", 1, [_device("gpu-0")])]
    api.add("s", spec(CLASS_SHARED, capacity={"cores": "10"}))
    with caplog.at_level(logging.INFO, logger="gpuslice.k8s.dra.allocator"):
        DraAllocator(api).run_once()
    assert [r.getMessage() for r in caplog.records] == ["claim t/s -> a ['gpu-0']"]


def test_a_pod_of_two_claims_preempts_the_cheapest_holders_that_make_room_for_both() -> None:
    api, allocator = _four_holders()
    _two_claim_pod(api, spec(CLASS_WHOLE), spec(CLASS_WHOLE), name="vip")
    api.pods[-1]["spec"]["priority"] = 35
    allocator.run_once()
    assert sorted(api.deleted) == ["low0", "low1"] and allocator.preemptions == 2  # one GPU each
    assert "preempted 2 lower-priority pod(s) on a" in dict(api.events)["vip-0"]
    freed = {api.results(f"low{k}")[0]["device"] for k in (0, 1)}
    for gone in ("low0", "low1"):  # the resource claim controller frees the victims' claims
        del api.claims[("t", gone)]
    allocator.run_once()
    assert not api.gated("vip-0") and len(api.results("vip-0")) == len(api.results("vip-1")) == 1
    assert {api.results(f"vip-{k}")[0]["device"] for k in (0, 1)} == freed  # the GPUs the victims held


def _two_gpus_each_held_by_a_share(api: FakeApi) -> None:
    """Node a: two 4 GiB GPUs, each held by one 3 GiB share (priorities 10 and 20): no GPU takes a
    second 3 GiB share until its holder goes."""
    api.slices = [_slice("a", 1, [_device("gpu-0", 4096), _device("gpu-1", 4096)])]
    for k in range(2):
        api.add(
            f"low{k}", spec(CLASS_SHARED, capacity={"memory": "3Gi", "cores": "50"}), priority=10 * (k + 1)
        )


def test_a_victim_set_is_judged_with_all_of_the_pods_claims_held_together_not_each_alone() -> None:
    """Each 3 GiB claim alone fits once the cheapest holder goes; both together need both GPUs free.
    Judging the first claim alone would evict one pod and leave the preemptor waiting forever."""
    api = FakeApi()
    _two_gpus_each_held_by_a_share(api)
    allocator = DraAllocator(api, "bestfit")
    allocator.run_once()
    assert {api.results(f"low{k}")[0]["device"] for k in range(2)} == {"gpu-0", "gpu-1"}
    share = spec(CLASS_SHARED, capacity={"memory": "3Gi", "cores": "50"})
    _two_claim_pod(api, share, share, name="vip")
    api.pods[-1]["spec"]["priority"] = 30
    allocator.run_once()
    assert sorted(api.deleted) == ["low0", "low1"]
    for gone in ("low0", "low1"):
        del api.claims[("t", gone)]
    allocator.run_once()
    assert not api.gated("vip-0")
    assert {api.results(f"vip-{k}")[0]["device"] for k in range(2)} == {"gpu-0", "gpu-1"}


def test_a_pod_whose_claims_do_not_fit_together_even_with_every_victim_gone_preempts_nobody() -> None:
    api = FakeApi()
    _two_gpus_each_held_by_a_share(api)
    allocator = DraAllocator(api, "bestfit")
    allocator.run_once()
    _two_claim_pod(api, spec(CLASS_WHOLE, count=2), spec(CLASS_WHOLE), name="vip")  # three GPUs on a
    api.pods[-1]["spec"]["priority"] = 100
    allocator.run_once()
    assert api.deleted == [] and api.gated("vip-0") and api.results("vip-0") == api.results("vip-1") == []


def test_a_preemption_what_if_leaves_the_inventorys_ledger_as_it_found_it() -> None:
    """The what-if gives the victims' claims back and holds the pod's claims in the real ledger, then
    undoes both: every column as before, every holder still held (a second plan is the same)."""
    api = FakeApi()
    _two_gpus_each_held_by_a_share(api)
    DraAllocator(api, "bestfit").run_once()
    inventory = Inventory(api.list_slices(), api.list_claims(), "bestfit", {"p-low0": 10, "p-low1": 20})
    assert inventory.ledger is not None
    before = inventory.free(0)
    ask = ClaimAsk("gpu", 1, 3072, 50, False)
    first = inventory.preemption([ask, ask], 30, None)
    assert first is not None and sorted(h.pods[0][1] for h in first.victims) == ["low0", "low1"]
    assert inventory.free(0) == before
    inventory.ledger.check_invariants()
    assert inventory.preemption([ask, ask], 30, None) == first
    assert inventory.preemption([ask], 30, None) is not None  # one claim: the cheapest holder only
    (alone,) = inventory.preemption([ask], 30, None).victims  # type: ignore[union-attr]
    assert alone.pods[0][1] == "low0" and inventory.free(0) == before


def test_what_was_told_is_kept_only_for_pods_still_gated() -> None:
    """A long-running allocator remembers the last reason posted per gated pod (so it is posted once),
    and forgets a pod once it is gone: memory bounded by the gated pods, not by every pod ever refused."""
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    for k in range(3):
        api.add(f"bad-{k}", spec(CLASS_SHARED, capacity={"memory": "lots"}))
    allocator = DraAllocator(api)
    assert allocator.run_once() == 0 and len(api.events) == 3
    assert len(allocator._told) == 3
    api.pods[:] = [p for p in api.pods if p["metadata"]["name"] != "bad-0"]  # deleted by its owner
    assert allocator.run_once() == 0 and len(api.events) == 3  # the others are not told again
    assert len(allocator._told) == 2


def test_a_two_claim_pod_on_a_cluster_without_gpuslice_pools_is_told_there_are_none() -> None:
    api = FakeApi()  # no ResourceSlice of gpuslice's driver
    _two_claim_pod(api, spec(CLASS_WHOLE), spec(CLASS_WHOLE))
    assert DraAllocator(api).run_once() == 0 and api.gated("p-0")
    assert api.events == [("p-0", f"claims p-0, p-1: 0/0 nodes fit: no node publishes {DRIVER} GPUs")]


def test_a_two_claim_pod_goes_to_the_node_its_selector_names_not_to_the_policys_choice() -> None:
    api = _pools_a_b_with_a_half_full()  # best fit would take a: its one free GPU is the tightest
    share = spec(CLASS_SHARED, capacity={"cores": "10"})
    _two_claim_pod(api, share, share)
    api.pods[-1]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "b"}
    assert DraAllocator(api, "bestfit").run_once() == 1
    assert {r["pool"] for name in ("p-0", "p-1") for r in api.results(name)} == {"b"}


def test_a_claim_that_fits_only_where_the_selector_forbids_is_named_with_the_selector() -> None:
    api = _pools_a_b_with_a_half_full()
    _two_claim_pod(api, spec(CLASS_SHARED, capacity={"cores": "10"}), spec(CLASS_WHOLE, count=2))
    api.pods[-1]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "a"}  # two free GPUs: b only
    assert DraAllocator(api, "bestfit").run_once() == 0 and api.gated("p-0")
    ((pod, message),) = api.events
    assert pod == "p-0"
    assert message.endswith(": claim 2 of the pod's 2 fits no node the pod's node selector allows"), message


def test_a_half_allocated_pod_whose_selector_names_the_node_it_holds_gets_the_rest_there() -> None:
    """Its held claim's node and its node selector agree: nothing to refuse, the rest goes there."""
    api = _pools_a_b_with_a_half_full()
    share = spec(CLASS_SHARED, capacity={"cores": "10"})
    _two_claim_pod(api, share, share)
    api.claims[("t", "p-0")]["status"] = {
        "allocation": {"devices": {"results": [_result("gpu-1", pool="b")]}}
    }
    api.pods[-1]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "b"}
    assert DraAllocator(api, "bestfit").run_once() == 1 and api.events == []
    assert [r["pool"] for r in api.results("p-1")] == ["b"]


def test_a_pod_waits_in_the_metrics_under_the_code_of_its_refusal() -> None:
    """The pending pods the cluster metrics count, by reason: a claim gpuslice can never allocate is an
    invalid request (a quantity that is none, no GPU could serve it, claims held on two nodes), a pod
    waiting for the pods it preempted is preempting."""
    api = FakeApi()
    api.add_node("a", "dgx-h100")
    api.add("lots", spec(CLASS_SHARED, capacity={"memory": "lots"}))
    api.add("none", spec(CLASS_WHOLE, count=0))
    _two_claim_pod(api, spec(CLASS_WHOLE), spec(CLASS_WHOLE), name="split")  # one held on a, pinned to b
    api.claims[("t", "split-0")]["status"] = {"allocation": {"devices": {"results": [_result("gpu-0")]}}}
    api.pods[-1]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "b"}
    allocator = DraAllocator(api)
    allocator.run_once()
    assert {uid: code for uid, (code, _) in allocator.pending.items()} == {
        "p-lots": "invalid_request",
        "p-none": "invalid_request",
        "p-split-0": "invalid_request",
    }
    api, allocator = _four_holders()
    api.add("vip", spec(CLASS_WHOLE), priority=35)
    allocator.run_once()
    assert allocator.pending["p-vip"][0] == RefusalCode.PREEMPTING.label
