"""The cluster dashboard's routes on the extender (k8s/extender/dashboard): the page, its files and
view.json, read-only, for the loopback only, nothing but the fixed files.

``CONTRACT_VIEW`` is the cluster view as the page reads it, and ``cluster_with_pods`` a real ClusterState
whose view (snapshot.cluster_view) the extender's own app serves; test_cluster_dashboard_browser.py draws
both.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

import pytest
from starlette.applications import Starlette

with warnings.catch_warnings():
    # starlette asks for its httpx2 fork at import; the httpx we have serves these tests the same.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from test_extender import FakeApi, args, inventory, make_state, pod_json

from gpuslice.k8s.annotations import MigSlot
from gpuslice.k8s.extender import RELISTED, ClusterState, WatchEvent, create_app
from gpuslice.k8s.extender.dashboard import VIEW_MAX_AGE_S, ViewCache, mount

XSS = "<img src=x onerror=alert(1)>"

# Two nodes: n1 with two pods sharing GPU 0, n2<img…> (a name that is HTML) with its GPU 1 in MIG mode
# holding two instances.
CONTRACT_VIEW: dict[str, Any] = {
    "generated": 1733380000.0,
    "synced": True,
    "totals": {"nodes": 2, "gpus": 4, "unallocated_percent": 62.5, "fragmentation_percent": 12.0,
               "pending": 2, "preemptions": 1},
    "nodes": [
        {"name": "n1", "model": "A100-SXM4-80GB", "unallocated_percent": 62.5, "fragmentation_percent": 10.0,
         "gpus": [
             {"index": 0, "memory_mib": 81920, "milli_free": 100, "memory_free_mib": 20480, "mig": False,
              "slices": [
                  {"pod": "default/train-1", "milli": 600, "memory_mib": 40960, "mig_profile": None,
                   "mig_start": None},
                  {"pod": "default/infer-2", "milli": 300, "memory_mib": 20480, "mig_profile": None,
                   "mig_start": None}]},
             {"index": 1, "memory_mib": 81920, "milli_free": 1000, "memory_free_mib": 81920, "mig": False,
              "slices": []}]},
        {"name": f"n2{XSS}", "model": "A100-SXM4-80GB", "unallocated_percent": 50.0,
         "fragmentation_percent": 0.0,
         "gpus": [
             {"index": 0, "memory_mib": 81920, "milli_free": 1000, "memory_free_mib": 81920, "mig": False,
              "slices": []},
             {"index": 1, "memory_mib": 81920, "milli_free": 0, "memory_free_mib": 0, "mig": True,
              "slices": [
                  {"pod": "ml/mig-small", "milli": 142, "memory_mib": 9728, "mig_profile": "1g.10gb",
                   "mig_start": 6},
                  {"pod": "ml/mig-big", "milli": 428, "memory_mib": 40192, "mig_profile": "3g.40gb",
                   "mig_start": 0}]}]},
    ],
    "pending": [
        {"pod": "default/big", "code": "insufficient_memory",
         "reason": "0/2 nodes fit: 2 insufficient GPU memory (need 90000 MiB, free at most 81920 MiB)",
         "since": 1733379000.0},
        {"pod": f"default/{XSS}", "code": "insufficient_gpu", "reason": f"needs 9 GPUs {XSS}", "since": None},
    ],
    "claims": [
        {"claim": "ml/shared-claim", "node": "n1", "pool": "n1", "devices": ["gpu-1"], "share": "50%"}],
    "history": [
        {"t": 1733379900.0, "unallocated_percent": 71.0, "fragmentation_percent": 11.5},
        {"t": 1733379960.0, "unallocated_percent": 66.0, "fragmentation_percent": 14.0},
        {"t": 1733380000.0, "unallocated_percent": 62.5, "fragmentation_percent": 12.0},
    ],
}  # fmt: skip


def dashboard_app(view: Mapping[str, Any]) -> Starlette:
    """The dashboard's routes alone, over a fixed view (create_app adds them over a ClusterState)."""
    app = Starlette()
    mount(app, lambda: view)
    return app


@pytest.fixture
def http() -> TestClient:
    return TestClient(dashboard_app(CONTRACT_VIEW), base_url="http://localhost:8888")


def test_the_page_and_its_files_are_served_under_the_same_csp_as_serves_dashboard(http):
    from gpuslice.server.dashboard import CONTENT_SECURITY_POLICY

    page = http.get("/cluster/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="cluster.js"' in page.text and 'href="cluster.css"' in page.text
    for name, media in (("cluster.js", "text/javascript"), ("cluster.css", "text/css")):
        reply = http.get(f"/cluster/{name}")
        assert reply.status_code == 200 and reply.headers["content-type"].startswith(media)
        assert reply.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert reply.headers["x-content-type-options"] == "nosniff"
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


def test_cluster_without_the_slash_redirects_to_the_page(http):
    reply = http.get("/cluster", follow_redirects=False)
    assert reply.status_code == 308 and reply.headers["location"] == "cluster/"
    assert http.get("/cluster").text == http.get("/cluster/").text


def test_view_json_is_the_view_as_json(http):
    reply = http.get("/cluster/view.json")
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    assert reply.json() == CONTRACT_VIEW


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("path", ["/cluster/", "/cluster/view.json", "/cluster/cluster.js", "/cluster"])
def test_every_method_but_get_is_refused_with_405(http, method, path):
    reply = http.request(method, path, content=b"{}")
    assert reply.status_code == 405
    assert set(reply.headers["allow"].split(", ")) == {"GET", "HEAD"}


@pytest.mark.parametrize(
    "path",
    [
        "/cluster/..%2F..%2F..%2Fpyproject.toml",  # %2F decoded: not one path segment, no route
        "/cluster/..%2F__init__.py",
        "/cluster/%2e%2e/app.py",
        "/cluster/__init__.py",  # in the package folder, not one of the page's files
        "/cluster/static%2Fcluster.js",
        "/cluster/index.html",  # the page is /cluster/, under one name only
        "/cluster/cluster.js%00.html",
        "/cluster/CLUSTER.JS",
    ],
)
def test_only_the_pages_own_files_are_served_whatever_the_path(http, path):
    reply = http.get(path)
    assert reply.status_code == 404, reply.text
    assert "cluster" not in reply.headers.get("content-type", "") and "import" not in reply.text


@pytest.mark.parametrize("host", ["localhost", "localhost:8888", "127.0.0.1:9000", "[::1]:8888", "LOCALHOST"])
def test_the_loopback_is_answered_under_any_port(host):
    http = TestClient(dashboard_app(CONTRACT_VIEW))
    for path in ("/cluster/", "/cluster/view.json", "/cluster/cluster.js"):
        assert http.get(path, headers={"host": host}).status_code == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8888", "10.0.0.7", "localhost.evil.example", ""]
)
def test_a_host_that_is_not_the_loopback_is_refused_as_dns_rebinding(host):
    http = TestClient(dashboard_app(CONTRACT_VIEW))
    for path in ("/cluster/", "/cluster/view.json", "/cluster/cluster.js"):
        reply = http.get(path, headers={"host": host})
        assert reply.status_code == 400 and "kubectl port-forward" in reply.text
        assert "default/big" not in reply.text


def test_two_host_headers_are_refused_whichever_is_the_loopback(http):
    for hosts in (["localhost", "evil.example"], ["evil.example", "localhost"]):
        reply = http.get("/cluster/view.json", headers=[("host", h) for h in hosts])
        assert reply.status_code == 400


def test_html_in_names_reaches_the_page_as_json_strings_never_as_markup(http):
    reply = http.get("/cluster/view.json")
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["x-content-type-options"] == "nosniff"  # never sniffed into HTML
    pending = {p["pod"]: p["reason"] for p in json.loads(reply.content)["pending"]}
    assert pending[f"default/{XSS}"] == f"needs 9 GPUs {XSS}"


def test_the_view_is_built_once_per_max_age_however_many_pages_ask():
    builds: list[int] = []

    def view() -> dict[str, Any]:
        builds.append(1)
        return {"n": len(builds)}

    cached = ViewCache(view, max_age_s=3600)
    assert [cached.body() for _ in range(5)] == [b'{"n":1}'] * 5
    fresh = ViewCache(view, max_age_s=0)
    assert fresh.body() == b'{"n":2}' and fresh.body() == b'{"n":3}'


def test_view_json_is_gzipped_only_for_a_client_that_accepts_it(http):
    import gzip

    with http.stream("GET", "/cluster/view.json", headers={"accept-encoding": "gzip, deflate, br"}) as zipped:
        wire_bytes = b"".join(zipped.iter_raw())  # as they went over the wire, not decoded by httpx
    assert zipped.headers["content-encoding"] == "gzip" and zipped.headers["vary"] == "Accept-Encoding"
    assert json.loads(gzip.decompress(wire_bytes)) == CONTRACT_VIEW
    plain = http.get("/cluster/view.json", headers={"accept-encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.json() == CONTRACT_VIEW


# ---- through the extender's app, over a real ClusterState -------------------------------------------

SHARE = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "20000", "gpuslice.io/gpucores": "30"}


def cluster_with_pods(api: FakeApi) -> ClusterState:
    """n1: two pods sharing one GPU (best fit packs the second onto the first's GPU), one of them named
    as HTML; n2: GPU 1 in MIG mode with a 3g.40gb at slot 0 and a 1g.10gb at slot 6, both held by pods;
    "big" (90,000 MiB on one GPU) refused by /filter and so pending, with its reason."""
    mig = {1: (MigSlot("3g.40gb", 0, "MIG-3g", 1), MigSlot("1g.10gb", 6, "MIG-1g", 2))}
    state = make_state(api, {"n1": inventory(gpus=2), "n2": inventory(gpus=2, mig=mig)})
    # the watch's first full lists, as the extender takes them in at startup: the state is synced
    state.apply(WatchEvent("Node", RELISTED, {"items": [{"metadata": {"name": n}} for n in ("n1", "n2")]}))
    state.apply(WatchEvent("Pod", RELISTED, {"items": []}))
    for name, resources, node in (
        ("train-1", SHARE, "n1"),
        (XSS, SHARE, "n1"),
        ("mig-big", {"gpuslice.io/mig-3g.40gb": "1"}, "n2"),
        ("mig-small", {"gpuslice.io/mig-1g.10gb": "1"}, "n2"),
    ):
        pod = pod_json(name, resources)
        api.pods[("team-a", name)] = pod
        assert state.bind("team-a", name, pod["metadata"]["uid"], node) == "", name
    big = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "90000"}  # more than any GPU has
    assert state.filter(pod_json("big", big), ["n1", "n2"]).passed == []
    return state


def extender_client(state: ClusterState, events: Any = None) -> TestClient:
    return TestClient(create_app(state, events), base_url="http://localhost:8888")


def test_view_json_of_a_real_cluster_shows_each_gpus_pods_mig_instances_and_pending_reasons():
    with extender_client(cluster_with_pods(FakeApi())) as http:
        reply = http.get("/cluster/view.json")
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    view = reply.json()
    nodes = {n["name"]: n for n in view["nodes"]}
    assert view["synced"] is True and sorted(nodes) == ["n1", "n2"]
    assert view["totals"]["nodes"] == 2 and view["totals"]["gpus"] == 4 and view["totals"]["pending"] == 1
    shared = [g for g in nodes["n1"]["gpus"] if g["slices"]]
    assert len(shared) == 1  # both pods on one GPU
    assert sorted((s["pod"], s["milli"], s["memory_mib"]) for s in shared[0]["slices"]) == [
        (f"team-a/{XSS}", 300, 20000),  # the HTML name, as a JSON string
        ("team-a/train-1", 300, 20000),
    ]
    assert shared[0]["milli_free"] == 400 and shared[0]["mig"] is False
    mig = nodes["n2"]["gpus"][1]
    assert mig["mig"] is True
    assert sorted((s["pod"], s["mig_profile"], s["mig_start"], s["mig_slots"]) for s in mig["slices"]) == [
        ("team-a/mig-big", "3g.40gb", 0, 4),  # its memory slots of the GPU's 8, from the profile
        ("team-a/mig-small", "1g.10gb", 6, 1),
    ]
    [pending] = view["pending"]
    assert pending["pod"] == "team-a/big" and "0/2 nodes fit" in pending["reason"] and pending["code"]
    assert view["history"] and set(view["history"][0]) == {
        "t",
        "unallocated_percent",
        "fragmentation_percent",
    }


def test_the_extenders_app_serves_the_page_read_only():
    with extender_client(cluster_with_pods(FakeApi())) as http:
        assert 'src="cluster.js"' in http.get("/cluster/").text
        assert http.post("/cluster/view.json", json={}).status_code == 405
        assert http.get("/cluster/..%2Fapp.py").status_code == 404
        assert http.get("/cluster/view.json", headers={"host": "evil.example"}).status_code == 400
        assert http.get("/healthz").status_code == 200  # the verbs keep answering any Host


def test_an_empty_cluster_is_an_empty_view():
    with extender_client(ClusterState(FakeApi())) as http:
        view = http.get("/cluster/view.json").json()
    assert view["nodes"] == [] and view["pending"] == [] and view["totals"]["gpus"] == 0


def test_before_the_first_full_lists_the_view_says_it_is_not_synced():
    def nothing_listed_yet() -> Any:
        yield WatchEvent("Node", "ADDED", {"metadata": {"name": "n"}})  # and never a relist

    with extender_client(ClusterState(FakeApi()), nothing_listed_yet()) as http:
        view = http.get("/cluster/view.json").json()
    assert view["synced"] is False


def test_a_pod_refused_after_a_refresh_shows_once_the_view_is_older_than_its_max_age():
    state = cluster_with_pods(FakeApi())
    with extender_client(state) as http:
        assert len(http.get("/cluster/view.json").json()["pending"]) == 1
        bigger = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "95000"}
        http.post("/filter", json=args(pod_json("bigger", bigger), ["n1", "n2"]))
        time.sleep(VIEW_MAX_AGE_S)
        pending = http.get("/cluster/view.json").json()["pending"]
    assert [p["pod"] for p in pending] == ["team-a/big", "team-a/bigger"]


def test_pages_waiting_for_a_slow_view_leave_the_worker_threads_to_bind():
    """Eight pages ask while a build is slow: they wait without a thread each, so the worker threads
    /bind runs on (the default pool) stay free."""
    import asyncio

    import anyio.to_thread
    import httpx

    started, release = threading.Event(), threading.Event()

    def slow_view() -> dict[str, Any]:
        started.set()
        release.wait(10)
        return CONTRACT_VIEW

    app = Starlette()
    mount(app, slow_view)

    async def eight_pages() -> tuple[float, list[httpx.Response]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            pages = [asyncio.create_task(client.get("/cluster/view.json")) for _ in range(8)]
            while not started.is_set():
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # every request has reached its wait
            borrowed = anyio.to_thread.current_default_thread_limiter().borrowed_tokens
            release.set()
            return borrowed, await asyncio.gather(*pages)

    borrowed, replies = asyncio.run(eight_pages())
    assert borrowed == 0  # none of the default pool's threads waits on the dashboard
    assert [r.json() for r in replies] == [CONTRACT_VIEW] * 8
