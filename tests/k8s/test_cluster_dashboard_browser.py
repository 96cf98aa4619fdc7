"""Acceptance: headless Chromium loads the extender's cluster dashboard from a real HTTP server (uvicorn on
a free localhost port), checks what a person would see, and takes a screenshot
(docs/cluster-dashboard.png only with GPUSLICE_UPDATE_SCREENSHOT=1).

Debian's chromium and chromium-driver through Selenium, as serve's dashboard test drives them (its
``browser`` fixture and ``until``); without them the test is skipped, unless GPUSLICE_REQUIRE_EXTERNAL
is set (CI), where it fails.
"""

from __future__ import annotations

import copy
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "server"))
from test_cluster_dashboard import CONTRACT_VIEW, XSS, cluster_with_pods, dashboard_app  # noqa: E402
from test_dashboard_browser import UPDATE_SCREENSHOT, browser, until  # noqa: E402
from test_extender import FakeApi  # noqa: E402

from gpuslice.k8s.extender import ClusterState, create_app  # noqa: E402

__all__ = ["browser"]  # the fixture, imported for pytest to find
pytestmark = [pytest.mark.browser, pytest.mark.slow]


@contextmanager
def served(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on a free loopback port, in a thread; yields the dashboard's URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://localhost:{port}/cluster/"
    finally:
        server.should_exit = True
        thread.join(10)


# The page redraws every 3 s, replacing its rows; one script call reads everything between two redraws.
READ_PAGE = """
const text = (css) => [...document.querySelectorAll(css)].map((e) => e.textContent);
return {
  rows: [...document.querySelectorAll("#map .node")].map((row) => ({
    node: row.dataset.node, text: row.textContent,
    gpus: [...row.querySelectorAll(".gpu")].map((g) => ({
      gpu: g.dataset.gpu, mig: g.classList.contains("mig"),
      segments: [...g.querySelectorAll(".seg")].map((s) => ({
        pod: s.dataset.pod, label: s.textContent, title: s.title, mig: s.classList.contains("mig"),
        left: parseFloat(s.style.left), width: parseFloat(s.style.width)}))}))})),
  gpuElements: document.querySelectorAll(".gpu").length,
  mapCount: document.getElementById("map-count").textContent,
  pending: Object.fromEntries([...document.querySelectorAll("#pending tbody tr")]
    .map((tr) => [tr.dataset.pod, tr.textContent])),
  claims: text("#claims tbody tr"),
  totals: Object.fromEntries([...document.querySelectorAll("#totals .total")]
    .map((t) => [t.dataset.total, t.querySelector("dd").textContent])),
  lines: document.querySelectorAll("#history polyline").length,
  images: document.querySelectorAll("img").length,
  banner: document.getElementById("banner").hidden ? "" : document.getElementById("banner").textContent,
  rendered: performance.getEntriesByName("map-rendered").length,
};
"""


def read(browser: Any) -> dict[str, Any]:
    return browser.execute_script(READ_PAGE)


def read_until(browser: Any, what: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The page, once ``check(page)`` holds (the page redraws on its own: scroll, filter, refresh)."""
    return until(what, lambda: (page := read(browser)) and check(page) and page)


def loaded(browser: Any, url: str) -> dict[str, Any]:
    browser.get(url)
    until("the first refresh", lambda: browser.find_element("id", "updated").text.startswith("updated"))
    return read(browser)


def gpu_of(page: dict[str, Any], node: str, index: int) -> dict[str, Any]:
    row = next(r for r in page["rows"] if r["node"] == node)
    return next(g for g in row["gpus"] if g["gpu"] == str(index))


def test_dashboard_of_a_real_extender_shows_each_gpus_pods_mig_instances_and_pending_reasons(
    browser, tmp_path
):
    with served(create_app(cluster_with_pods(FakeApi()))) as url:
        page = loaded(browser, url)

        # Two pods on one GPU: both on that GPU's bar, side by side, each as wide as its share (30 %).
        [shared] = [g for g in next(r for r in page["rows"] if r["node"] == "n1")["gpus"] if g["segments"]]
        assert sorted(s["pod"] for s in shared["segments"]) == [f"team-a/{XSS}", "team-a/train-1"]
        assert sorted((s["left"], s["width"]) for s in shared["segments"]) == [(0, 30), (30, 30)]
        # A MIG GPU: its instances where they sit, 3g.40gb over slots 0-3, 1g.10gb on slot 6 (of 8).
        mig = gpu_of(page, "n2", 1)
        assert mig["mig"] and all(s["mig"] for s in mig["segments"])
        at = {s["label"]: (s["left"], s["width"]) for s in mig["segments"]}
        assert at == {"mig-big": (0, 50), "mig-small": (75, 12.5)}
        # The refused pod, with the extender's reason.
        assert "0/2 nodes fit" in page["pending"]["team-a/big"]
        assert page["totals"]["nodes"] == "2" and page["totals"]["pending"] == "1"

        # The pod whose name is HTML is text on its segment: no element was made from it, nothing ran.
        assert f"{XSS}" in {s["label"] for s in shared["segments"]}
        assert page["images"] == 0

        # The screenshot for the docs: the whole page at laptop width.
        for _ in range(3):  # the window's height includes some chrome: grow it until the page fits
            size = browser.get_window_size()
            missing = browser.execute_script(
                "return document.documentElement.scrollHeight - window.innerHeight"
            )
            if missing <= 0:
                break
            browser.set_window_size(1366, size["height"] + missing)
        time.sleep(0.3)
        shot = REPO / "docs" / "cluster-dashboard.png" if UPDATE_SCREENSHOT else tmp_path / "shot.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], width  # nothing overflows sideways at 1366 px


def test_dashboard_draws_every_part_of_the_view(browser):
    with served(dashboard_app(CONTRACT_VIEW)) as url:
        page = loaded(browser, url)
        shared = gpu_of(page, "n1", 0)
        assert [(s["pod"], s["label"], s["left"], s["width"]) for s in shared["segments"]] == [
            ("default/train-1", "train-1", 0, 60),
            ("default/infer-2", "infer-2", 60, 30),
        ]
        assert gpu_of(page, "n1", 1)["segments"] == []
        assert "insufficient GPU memory (need 90000 MiB" in page["pending"]["default/big"]
        assert page["pending"][f"default/{XSS}"].startswith(f"default/{XSS}") and page["images"] == 0
        assert any("ml/shared-claim" in c and "gpu-1" in c for c in page["claims"])
        assert page["totals"] == {"nodes": "2", "GPUs": "4", "unallocated": "62.5%", "fragmented": "12%",
                                  "pending": "2", "preemptions": "1"}  # fmt: skip
        assert page["lines"] == 2 and page["banner"] == ""
        # A node whose name is HTML: its row carries the name as text.
        assert f"n2{XSS}" in {r["node"] for r in page["rows"]}
        assert any(r["text"].startswith(f"n2{XSS}") for r in page["rows"]) and page["images"] == 0

    # The extender goes away (the port-forward ended): a banner says so, the last data stays.
    banner = until("the unreachable banner", lambda: read(browser)["banner"])
    assert "Cannot reach the gpuslice extender" in banner and "port-forward" in banner
    assert len(read(browser)["rows"]) == 2


def test_an_extender_still_listing_the_cluster_says_so_and_shows_what_it_has(browser):
    with served(dashboard_app({**CONTRACT_VIEW, "synced": False})) as url:
        page = loaded(browser, url)
    assert "The extender is starting" in page["banner"] and len(page["rows"]) == 2


def test_claims_the_extender_cannot_list_say_why_instead_of_none(browser):
    refused = "cannot list ResourceClaims: 403 Forbidden"
    with served(dashboard_app({**CONTRACT_VIEW, "claims": [], "claims_error": refused})) as url:
        loaded(browser, url)
        said = browser.find_element("id", "claims-error")
        empty = browser.find_element("id", "claims-empty")
        assert said.is_displayed() and said.text == refused and not empty.is_displayed()


def test_an_empty_cluster_says_no_node_has_gpus(browser):
    with served(create_app(ClusterState(FakeApi()))) as url:
        page = loaded(browser, url)
        empty = browser.find_element("id", "map-empty").text
    assert page["rows"] == [] and page["mapCount"] == "0 nodes" and "No node advertises GPUs" in empty


def big_view(nodes: int, gpus: int = 8) -> dict[str, Any]:
    """``nodes`` nodes of ``gpus`` GPUs, each GPU with one pod on it, and as many pending pods."""
    view = copy.deepcopy(CONTRACT_VIEW)
    view["pending"] = [{**CONTRACT_VIEW["pending"][0], "pod": f"ns/waiting-{i}"} for i in range(nodes)]
    gpu = CONTRACT_VIEW["nodes"][0]["gpus"][0]
    view["nodes"] = [
        {**CONTRACT_VIEW["nodes"][0], "name": f"node-{i:04d}",
         "gpus": [{**gpu, "index": g, "slices": [{**gpu["slices"][0], "pod": f"ns/pod-{i}-{g}"}]}
                  for g in range(gpus)]}
        for i in range(nodes)
    ]  # fmt: skip
    return view


def test_a_thousand_nodes_keep_only_the_rows_in_view_in_the_dom_and_reach_the_last(browser):
    with served(dashboard_app(big_view(1000))) as url:
        page = loaded(browser, url)
        assert page["mapCount"] == "1000 nodes"
        assert 0 < page["gpuElements"] < 400  # of 8,000
        assert "node-0000" in {r["node"] for r in page["rows"]}
        # 1,000 pending pods: the first 200 listed, and how many more there are
        assert len(page["pending"]) == 200
        assert browser.find_element("id", "pending-more").text.startswith("and 800 more")

        # Scrolled to the bottom: the last node is drawn, the first is gone.
        browser.execute_script("const m = document.getElementById('map'); m.scrollTop = m.scrollHeight")
        page = read_until(browser, "the last row", lambda p: "node-0999" in {r["node"] for r in p["rows"]})
        assert "node-0000" not in {r["node"] for r in page["rows"]}
        assert page["gpuElements"] < 400

        # Filtering by a pod's name finds its node, and only it; clearing shows all again.
        box = browser.find_element("id", "filter")
        box.send_keys("pod-999-7")
        page = read_until(browser, "the pod filter", lambda p: p["mapCount"].startswith("1 of"))
        assert [r["node"] for r in page["rows"]] == ["node-0999"]
        box.clear()
        box.send_keys("node-05")
        page = read_until(browser, "the node filter", lambda p: p["mapCount"].startswith("100 of"))
        assert all(r["node"].startswith("node-05") for r in page["rows"])
