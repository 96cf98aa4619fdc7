"""Acceptance: headless Chromium loads the dashboard of a real ``gpuslice serve --simulate
dgx-h100`` with jobs in every state, checks what a person would see, and takes a screenshot
(docs/dashboard.png only with GPUSLICE_UPDATE_SCREENSHOT=1).

Debian's chromium and chromium-driver, driven by Selenium (the driver is the one Debian ships for that
exact browser, so nothing is downloaded). Without them the test is skipped, unless
GPUSLICE_REQUIRE_EXTERNAL is set (CI), where it fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# The README's picture is refreshed only on request (GPUSLICE_UPDATE_SCREENSHOT=1): a test run must not
# rewrite a tracked file. Otherwise the screenshot goes to a temporary folder and is checked there.
UPDATE_SCREENSHOT = os.environ.get("GPUSLICE_UPDATE_SCREENSHOT") == "1"
FAKE_LOAD = str(Path(sys.executable).parent / "gpuslice-fake-load")
XSS = "<img src=x onerror=alert(1)>"
pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def browser(external_tool) -> Iterator[Any]:
    """A headless Chromium that never touches the network beyond the page it is sent to."""
    chromium = external_tool("chromium", "Debian: apt install chromium")
    chromedriver = external_tool("chromedriver", "Debian: apt install chromium-driver")
    from selenium import webdriver  # the test extra's; nothing to skip
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="gpuslice-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium  # given, with the driver path: Selenium Manager is never asked
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1",
                f"--user-data-dir={profile}", "--window-size=1366,768"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            result = check()
            if result:
                return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def fake(mem: str, seconds: float = 600) -> list[str]:
    return [FAKE_LOAD, "--mem", mem, "--seconds", str(seconds)]


def jobs_in_every_state(server: Any) -> dict[str, str]:
    """Submit jobs and drive them into every state; returns role -> job id."""
    state = lambda job_id: server.jobs()[job_id]["state"]  # noqa: E731
    ids = {
        "ok": server.submit(["true"])["id"],
        "bad": server.submit(["sh", "-c", "echo out of memory >&2; exit 3"])["id"],
        "train": server.submit(fake("30GiB"), memory="40GiB", compute_percent=50, tenant="vision")["id"],
        # sh -c's extra argument becomes $0: a command line that is HTML, and a job that runs fine.
        "xss": server.submit(["sh", "-c", "sleep 600", XSS], memory="10GiB", compute_percent=25)["id"],
        "serve": server.submit(fake("12GiB"), memory="16GiB", priority="high", tenant="web")["id"],
        "notebook": server.submit(fake("9GiB"), memory="24GiB", tenant="research")["id"],
        "victim": server.submit(fake("1GiB"), gpus=4, priority="low")["id"],
    }
    # Its first line says its supervisor is up: a SIGTERM before that would end the supervisor itself
    # (the job is then "lost", not preempted; the same wait as in test_e2e's preemption test).
    logs = f"/v1/jobs/{ids['victim']}/logs"
    server.wait(lambda: "fake-load: pid" in server.http.get(logs).text, 30, "the low-priority job to run")
    # Needs 4 whole GPUs; only the low-priority job's can be had: it is preempted and waits again.
    ids["big"] = server.submit(["sleep", "600"], gpus=4, priority="high", preemptible=False)["id"]
    server.wait(lambda: state(ids["big"]) == "RUNNING", 30, "the high-priority job to preempt its way in")
    ids["cancelled"] = server.submit(["sleep", "600"], gpus=8, priority="idle")["id"]
    r = server.http.post(f"/v1/jobs/{ids['cancelled']}/cancel", headers=server.auth)
    assert r.status_code == 200, r.text
    ids["waiting"] = server.submit(fake("60GiB"), gpus=8)["id"]
    server.wait(lambda: state(ids["ok"]) == "SUCCEEDED" and state(ids["bad"]) == "FAILED", 30,
                "the short jobs to end")  # fmt: skip
    return ids


# The page redraws every 2 s, replacing its elements; reading it element by element from here could
# meet one that was just replaced. One script call reads everything between two redraws instead.
READ_PAGE = """
const text = (root, css) => [...root.querySelectorAll(css)].map((e) => e.innerText);
const rows = (id) => Object.fromEntries([...document.querySelectorAll(`#${id} tbody tr`)]
  .map((tr) => [tr.dataset.job, tr.innerText]));
return {
  tiles: [...document.querySelectorAll("#gpus .tile")].map((t) => ({
    gpu: t.dataset.gpu, classes: [...t.classList], text: t.innerText,
    slices: text(t, ".slice .job-id"), segments: t.querySelectorAll(".bar .segment:not(.external)").length,
    external: t.querySelectorAll(".bar .segment.external").length})),
  summary: document.getElementById("gpus-summary").innerText,
  running: rows("running"), queue: rows("queue"), finished: rows("finished"),
  events: text(document, "#events li"),
  commands: Object.fromEntries([...document.querySelectorAll("#running tbody tr")]
    .map((tr) => [tr.dataset.job, tr.querySelector(".command").textContent])),
  gpusText: document.getElementById("gpus").textContent,
  images: document.querySelectorAll("img").length,
};
"""


def job_ids(page: dict[str, Any]) -> set[str]:
    return set(page["running"]) | set(page["queue"])


def test_dashboard_shows_gpus_jobs_queue_and_events_of_a_real_server(serve, browser, tmp_path):
    server = serve("--grace", "2s")
    ids = jobs_in_every_state(server)
    sick = next(g["index"] for g in server.http.get("/v1/gpus").json() if not g["jobs"])
    mark = {"healthy": False, "reason": "XID 79: GPU has fallen off the bus"}
    assert server.http.post(f"/v1/gpus/{sick}/health", json=mark, headers=server.auth).status_code == 200
    gpus = server.http.get("/v1/gpus").json()
    queue = {q["id"]: q["reason"] for q in server.http.get("/v1/queue").json()}
    assert {ids["victim"], ids["waiting"]} <= set(queue)

    browser.get(server.sign_in_url)  # the link `serve` printed: a read-only cookie, then the page
    until("the first refresh", lambda: browser.find_element("id", "updated").text.startswith("updated"))
    page = browser.execute_script(READ_PAGE)

    # One tile per GPU, each showing its free memory and the slices the API reports on it.
    assert [t["gpu"] for t in page["tiles"]] == [str(g["index"]) for g in gpus]
    for tile, gpu in zip(page["tiles"], gpus, strict=True):
        assert f"GPU {gpu['index']}" in tile["text"] and "free" in tile["text"]
        assert ("idle" in tile["text"]) == (not gpu["jobs"])
        assert tile["slices"] == [s["id"] for s in gpu["jobs"]]
        assert tile["segments"] == len(gpu["jobs"])  # one per slice on the memory bar
        assert tile["external"] == (gpu["external_memory_bytes"] > 0)  # memory gpuslice did not hand out
        # The unhealthy GPU stands out, with its reason; the others say they are healthy.
        assert ("unhealthy" in tile["classes"]) == (gpu["index"] == sick)
    assert "UNHEALTHY" in page["tiles"][sick]["text"]
    assert "XID 79: GPU has fallen off the bus" in page["tiles"][sick]["text"]
    assert "1 unhealthy" in page["summary"]
    on_gpus = {s["id"] for g in gpus for s in g["jobs"]}
    assert {ids[k] for k in ("train", "xss", "serve", "notebook", "big")} <= on_gpus

    # Running jobs, the queue with the scheduler's own reasons, finished jobs with their end state.
    assert set(page["running"]) == {ids[k] for k in ("train", "xss", "serve", "notebook", "big")}
    assert "sleep 600" in page["running"][ids["big"]]
    for role in ("victim", "waiting"):
        assert queue[ids[role]] and queue[ids[role]] in page["queue"][ids[role]]
    assert "succeeded" in page["finished"][ids["ok"]]
    assert "failed" in page["finished"][ids["bad"]]
    assert "cancelled" in page["finished"][ids["cancelled"]]

    # Events, newest first: the preemption and the GPU fault are there.
    events = page["events"]
    assert any(ids["victim"] in e and "running → preempted" in e for e in events), events
    assert any(f"GPU {sick}" in e and "gpu-health" in e and "XID 79" in e for e in events), events

    # The job whose command is HTML shows as text: no element was made from it, nothing ran.
    assert page["commands"][ids["xss"]] == f"sh -c sleep 600 {XSS}"
    assert page["images"] == 0
    assert XSS in page["gpusText"]

    # It refreshes by itself, without reloading the page.
    browser.execute_script("window.stillThisPage = true")
    late = server.submit(["sleep", "600"], memory="8GiB", tenant="late")["id"]
    until("the new job to appear", lambda: late in job_ids(browser.execute_script(READ_PAGE)))
    assert browser.execute_script("return window.stillThisPage === true")

    # Laptop screen: nothing overflows sideways at 1366×768.
    width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width

    # The screenshot for the README: the whole page at laptop width.
    for _ in range(3):  # the window's height includes some chrome: grow it until the page fits
        size = browser.get_window_size()
        missing = browser.execute_script("return document.documentElement.scrollHeight - window.innerHeight")
        if missing <= 0:
            break
        browser.set_window_size(1366, size["height"] + missing)
    time.sleep(0.3)
    shot = REPO / "docs" / "dashboard.png" if UPDATE_SCREENSHOT else tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000

    # Narrow screen (a phone): one column, still no sideways scrolling of the page.
    browser.set_window_size(400, 800)
    until("the narrow layout", lambda: browser.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth"))  # fmt: skip

    # The server goes away: a banner says so, and the last data stays on screen.
    server.stop()
    read_banner = "const b = document.getElementById('banner'); return b.hidden ? '' : b.innerText"
    banner = until("the unreachable banner", lambda: browser.execute_script(read_banner))
    assert "Cannot reach the gpuslice server" in banner
    assert len(browser.execute_script(READ_PAGE)["tiles"]) == len(gpus)  # the last data stays
