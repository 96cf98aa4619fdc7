"""One quantity rule for the webhook, the extender and DRA, and MIG admission by the cluster's inventory.

The defects these guard: ``gpuslice.io/gpumem: 8Gi`` was read as 8,589,934,592 MiB and admitted (the pod
then waited forever); DRA capacity requests were truncated to whole MiB (1.5 MiB got 1) and a malformed
one failed the allocator's pass; a MIG profile was admitted when any GPU model anywhere had it.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_webhook import pod, review

from gpuslice.errors import InvalidRequest
from gpuslice.k8s import quantity
from gpuslice.k8s.annotations import (
    ANNOTATION_NODE_INVENTORY,
    InventoryGpu,
    MigSlot,
    NodeInventory,
    pod_gpu_request,
)
from gpuslice.k8s.dra.claim_ask import claim_ask
from gpuslice.k8s.mig_inventory import MigInventory, profiles_in
from gpuslice.k8s.webhook import admit


def _refusal(body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    answer = admit(review(body), **kwargs)["response"]
    assert answer["allowed"] is False, answer
    return answer["status"]


# ---- gpumem counts MiB --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "meant_mib"),
    [("8Gi", "8,192"), ("8G", "7,630"), ("1.5Mi", "2"), ("512Ki", "1"), ("8589934592", "8,192")],
)
def test_a_byte_quantity_on_gpumem_is_refused_by_the_webhook_and_the_extender_with_the_conversion(
    written: str, meant_mib: str
) -> None:
    body = pod({"limits": {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": written}})
    status = _refusal(body)
    assert status["code"] == 400
    assert f"counts MiB: {written!r} asks for" in status["message"]
    assert f"write a plain number of MiB ({meant_mib} if {written} was bytes)" in status["message"]
    with pytest.raises(InvalidRequest, match="counts MiB") as refused:  # the extender reads it the same
        pod_gpu_request(body)
    assert str(refused.value) in status["message"]


@pytest.mark.parametrize(
    ("resource", "written", "reason"),
    [
        ("gpuslice.io/gpu", "500m", "not a whole non-negative number"),
        ("gpuslice.io/gpu", "1.5", "not a whole non-negative number"),
        ("gpuslice.io/gpucores", "-30", "not a whole non-negative number"),
        ("gpuslice.io/gpu", "1e30", "out of range"),
        ("gpuslice.io/gpu", "x" * 10_000, "not a Kubernetes quantity"),
        ("gpuslice.io/gpumem", "8GiB", "not a Kubernetes quantity"),
    ],
)
def test_counts_are_whole_bounded_quantities(resource: str, written: str, reason: str) -> None:
    limits = {"gpuslice.io/gpu": "1", resource: written}
    status = _refusal(pod({"limits": limits}))
    assert reason in status["message"] and len(status["message"]) < 300


def test_plain_mib_and_si_counts_are_accepted() -> None:
    ask = pod_gpu_request(pod({"limits": {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "8192"}}))
    assert ask.memory_mib == 8192
    # the API server stores a plain 10000 as "10k" (its canonical form): that is 10,000 MiB
    ask = pod_gpu_request(pod({"limits": {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "10k"}}))
    assert ask.memory_mib == 10_000
    assert quantity.whole_count("1k", "n") == 1000 and quantity.mib_count("1e3", "m") == 1000


# ---- DRA capacity is bytes, rounded up -----------------------------------------------------------------


def _claim(capacity: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "t"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.gpuslice.io",
                            "count": 1,
                            "capacity": {"requests": capacity},
                        },
                    }
                ]
            }
        },
    }


def test_a_dra_memory_request_is_bytes_rounded_up_to_whole_mib() -> None:
    ask = claim_ask(_claim({"memory": "1.5Mi", "cores": "30"}))
    assert ask is not None and ask.memory_mib == 2 and ask.cores == 30
    ask = claim_ask(_claim({"memory": "10Gi"}))
    assert ask is not None and ask.memory_mib == 10 * 1024


@pytest.mark.parametrize("capacity", [{"memory": "lots"}, {"cores": "30.5"}, {"memory": "-1Gi"}])
def test_a_malformed_dra_capacity_is_refused_naming_the_request(capacity: dict[str, str]) -> None:
    with pytest.raises(InvalidRequest, match="request gpu: capacity"):
        claim_ask(_claim(capacity))


# ---- MIG profiles by the cluster's inventory ---------------------------------------------------------


def _node(model: str, mig: bool) -> dict[str, Any]:
    slots = (MigSlot("3g.20gb", 0),) if mig else ()
    inventory = NodeInventory((InventoryGpu(0, "GPU-0", model, 40960, True, slots),))
    return {"metadata": {"name": model, "annotations": {ANNOTATION_NODE_INVENTORY: inventory.to_json()}}}


def _mig_pod(profile: str) -> dict[str, Any]:
    return pod({"limits": {f"gpuslice.io/mig-{profile}": "1"}})


def test_a_mig_profile_is_admitted_only_when_a_gpu_in_this_cluster_offers_it() -> None:
    # an A100-40GB in MIG mode, an A100-80GB with MIG off: only the 40 GB table is on offer
    nodes = [_node("A100-40GB", mig=True), _node("A100-80GB", mig=False)]
    inventory = MigInventory(lambda: nodes, lambda: [])
    assert admit(review(_mig_pod("1g.5gb")), mig=inventory)["response"]["allowed"] is True
    status = _refusal(_mig_pod("1g.20gb"), mig=inventory)  # an 80 GB profile: no GPU here has it
    assert status["code"] == 400
    assert "no GPU in this cluster offers MIG profile '1g.20gb'" in status["message"]
    assert "1g.5gb" in status["message"] and "7g.40gb" in status["message"]
    # without API access, every known table counts (the old rule)
    assert admit(review(_mig_pod("1g.20gb")))["response"]["allowed"] is True


def test_a_dra_slice_offers_its_mig_devices_and_a_cluster_without_mig_offers_none() -> None:
    piece = {
        "spec": {
            "devices": [{"name": "gpu-0-mig-1g-18gb-0", "attributes": {"migProfile": {"string": "1g.18gb"}}}]
        }
    }
    assert profiles_in([], [piece]) == {"1g.18gb"}
    status = _refusal(
        _mig_pod("1g.5gb"), mig=MigInventory(lambda: [_node("A100-40GB", mig=False)], lambda: [])
    )
    assert "offered: none (no GPU here is in MIG mode)" in status["message"]


def test_the_inventory_is_read_once_per_ttl_and_a_failed_read_keeps_the_last_good_one() -> None:
    now, calls = [0.0], []
    healthy = [True]

    def nodes() -> list[dict[str, Any]]:
        calls.append(now[0])
        if not healthy[0]:
            raise ConnectionError("API server unreachable")
        return [_node("A100-40GB", mig=True)]

    inventory = MigInventory(nodes, lambda: [], ttl_s=30, clock=lambda: now[0])
    assert "1g.5gb" in inventory.profiles() and "1g.5gb" in inventory.profiles()
    assert calls == [0.0]
    now[0], healthy[0] = 31.0, False
    assert "1g.5gb" in inventory.profiles()  # the last good read stands
    assert calls == [0.0, 31.0]


def test_an_inventory_never_read_refuses_a_mig_pod_as_retryable() -> None:
    def down() -> list[dict[str, Any]]:
        raise ConnectionError("connection refused")

    status = _refusal(_mig_pod("1g.5gb"), mig=MigInventory(down, lambda: []))
    assert status["code"] == 503 and "cannot read the cluster's GPU inventory" in status["message"]
    # a pod without MIG never needs the inventory
    answer = admit(review(pod({"limits": {"gpuslice.io/gpu": "1"}})), mig=MigInventory(down, lambda: []))
    assert answer["response"]["allowed"] is True
