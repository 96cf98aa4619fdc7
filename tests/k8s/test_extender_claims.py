"""The cluster view's DRA claims: the extender lists ResourceClaims at most once per few seconds, keeps the
ones gpuslice's driver holds, takes only well-shaped fields from them (a claim is anyone's object), and
says in one line when it cannot list them instead of showing an empty list as if there were none."""

from __future__ import annotations

import warnings
from typing import Any

from test_extender import FakeApi

from gpuslice.k8s.dra.slices import DRIVER
from gpuslice.k8s.extender import ClusterState, create_app
from gpuslice.k8s.extender.claims import ClaimReader, claim_row

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient


def claim(name: str, results: Any, namespace: str = "ml") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "status": {"allocation": {"devices": {"results": results}}},
    }


SHARE = {
    "driver": DRIVER, "pool": "gpu-1", "device": "gpu-2", "shareID": "6a1b2c3d-0000-4000-8000-000000000001",
    "consumedCapacity": {"memory": "4Gi", "cores": "30"},
}  # fmt: skip
WHOLE = {"driver": DRIVER, "pool": "gpu-1", "device": "gpu-3"}
OTHER = {"driver": "gpu.nvidia.com", "pool": "gpu-1", "device": "gpu-0"}


def test_a_share_and_a_whole_gpu_become_rows_with_their_node_devices_and_share() -> None:
    assert claim_row(claim("infer", [SHARE])) == {
        "claim": "ml/infer", "node": "gpu-1", "pool": "gpu-1", "devices": ["gpu-2#6a1b2c3d"],
        "share": "cores 30, memory 4Gi",
    }  # fmt: skip
    row = claim_row(claim("train", [WHOLE, OTHER]))  # another driver's device in the same claim
    assert row is not None and row["devices"] == ["gpu-3"] and row["share"] == ""


def test_claims_gpuslice_holds_nothing_of_or_that_are_malformed_are_left_out() -> None:
    broken = [
        claim("theirs", [OTHER]),  # another driver's
        {"metadata": {"name": "pending", "namespace": "ml"}, "status": {}},  # not allocated
        claim("no-results", "results"),
        claim("device-number", [{**WHOLE, "device": 3}]),
        claim("no-pool", [{**WHOLE, "pool": ""}]),
        {"metadata": "ml/x", "status": {}},
        {**claim("x", [WHOLE]), "metadata": {"name": ["x"], "namespace": "ml"}},
        "not a claim",
        None,
    ]  # fmt: skip
    assert [claim_row(c) for c in broken] == [None] * len(broken)
    odd = claim_row(claim("odd", [{**SHARE, "consumedCapacity": {"memory": {"$ne": 1}, "cores": "5"}}]))
    assert odd is not None and odd["share"] == "cores 5"  # only strings and numbers are taken


class Lister:
    def __init__(self, items: list[Any] | None = None, error: Exception | None = None) -> None:
        self.items, self.error, self.calls = items or [], error, 0

    def __call__(self) -> list[Any]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.items


def test_the_list_is_read_at_most_once_per_window_however_often_the_view_is_built() -> None:
    now = [100.0]
    lister = Lister([claim("b", [WHOLE]), claim("a", [SHARE]), claim("c", [OTHER])])
    reader = ClaimReader(lister, ttl_s=5.0, clock=lambda: now[0])
    for _ in range(10):
        rows, error = reader.rows()
    assert lister.calls == 1 and error == "" and [r["claim"] for r in rows] == ["ml/a", "ml/b"]
    now[0] += 5.0
    reader.rows()
    assert lister.calls == 2


def test_a_refused_list_is_one_line_not_an_empty_list_that_looks_like_none() -> None:
    from kubernetes.client.exceptions import ApiException

    from gpuslice.k8s.kube_client import api_errors

    def refused() -> list[Any]:  # as KubernetesApi.list_resource_claims words the API's refusal
        with api_errors():
            raise ApiException(status=403, reason="Forbidden")

    reader = ClaimReader(refused)
    assert reader.rows() == ([], "cannot list ResourceClaims: the API server answered 403 Forbidden")
    assert ClaimReader(None).rows() == ([], "")  # an API that cannot list claims: nothing to say


def test_the_extenders_view_json_carries_the_claims_its_api_lists() -> None:
    api = FakeApi()
    api.list_resource_claims = Lister([claim("infer", [SHARE]), claim("theirs", [OTHER])])  # type: ignore[attr-defined]
    with TestClient(create_app(ClusterState(api)), base_url="http://localhost:8888") as http:
        view = http.get("/cluster/view.json").json()
    assert [c["claim"] for c in view["claims"]] == ["ml/infer"] and view["claims_error"] == ""
