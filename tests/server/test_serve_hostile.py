"""The hostile policy corpus (``tests/programs/hostile/``) against a real ``gpuslice serve``.

Each queue file is loaded into one running server through ``POST /v1/policies`` while jobs wait (every
scheduling pass orders them); each placement file is given at a server's start (``--placement FILE``)
and jobs are placed through it. While a file is loaded, a prober asks ``/v1/health`` every 20 ms; the
assertions: the verifier refuses what reaches outside, every other file costs counted faults of the kind
it provokes until it is detached (with an event that says why), the server kept answering (no answer
past 1 s in any file's window, p99 under 50 ms over all of them) and did not grow (its own memory: the
hook's is the worker's, bounded by its limit).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import ServerProcess, kill_jobs

HOSTILE = Path(__file__).parents[1] / "programs" / "hostile"
FILES = sorted(HOSTILE.glob("*.py"))
HEALTH_P99_S = 0.050  # over every window in which a hostile file was loaded (see the last test)
HEALTH_MAX_S = 1.0  # in any one window: a hook holding the server's GIL shows as its whole run
SLACK_BYTES = 100 * 2**20  # what the server itself may grow by while a hostile file is loaded
DETACH_WITHIN_S = 120.0  # five faults (each a budget, a kill, a restart) on a loaded two-core machine


def expected(path: Path) -> set[str]:
    (line,) = [line for line in path.read_text().splitlines() if line.startswith("expect:")]
    return {word for word in line.split()[1:] if word != "or"}


class HealthProbe:
    """A thread asking ``/v1/health`` every 20 ms on its own connection; latencies since a mark."""

    def __init__(self, url: str) -> None:
        self.latencies: list[tuple[float, float]] = []  # (when, seconds)
        self._stop = threading.Event()
        self._client = httpx.Client(base_url=url, timeout=30)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            response = self._client.get("/v1/health")
            took = time.perf_counter() - started
            assert response.status_code == 200
            self.latencies.append((started, took))
            time.sleep(0.02)

    def since(self, mark: float) -> list[float]:
        taken = [took for when, took in self.latencies if when >= mark]
        assert taken, "no health answer while the file was loaded"  # a quick detach: a few answers
        return taken

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def queue_slot(server: ServerProcess) -> dict[str, Any]:
    (slot,) = [p for p in server.http.get("/v1/policies").json() if p["family"] == "queue"]
    return slot


def placement_slot(server: ServerProcess) -> dict[str, Any]:
    (slot,) = [p for p in server.http.get("/v1/policies").json() if p["family"] == "placement"]
    return slot


def wait_detached(server: ServerProcess, read: Any) -> dict[str, Any]:
    deadline = time.monotonic() + DETACH_WITHIN_S
    while time.monotonic() < deadline:
        slot = read(server)
        if slot["detached"]:
            return slot
        time.sleep(0.2)
    raise AssertionError(f"not detached within {DETACH_WITHIN_S:g} s: {read(server)}")


def policy_events(server: ServerProcess) -> list[str]:
    events = server.http.get("/v1/events", params={"kind": "policy", "limit": 1000}).json()
    return [e["reason"] for e in events]


def check_faults(path: Path, slot: dict[str, Any], events: list[str]) -> None:
    kinds = {f["reason"] for f in slot["faults"]}
    assert kinds & expected(path), slot["faults"]
    assert kinds <= expected(path) | {"restarting"}, slot["faults"]
    detach = [e for e in events if "detached" in e and slot["name"] in e]
    assert detach, events
    assert any(kind in detach[-1] for kind in expected(path)), detach[-1]  # the event says why


# Every health latency measured while a hostile file was loaded, per file. A window lasts a fraction of
# a second to a few seconds (a few to 250 answers), too few for a p99 of its own on a busy machine (one
# late answer is the p99 of 60); the p99 is judged over all of them together, each window by its worst.
WINDOWS: dict[str, list[float]] = {}


def judge_window(path: Path, latencies: list[float]) -> None:
    WINDOWS[path.stem] = latencies
    worst = max(latencies)
    assert worst < HEALTH_MAX_S, f"/v1/health took {worst:.2f} s while {path.name} was loaded"


@pytest.fixture(scope="module")
def queue_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for every queue file: one 8-GPU job runs, three wait and are ordered every pass."""
    server = ServerProcess(tmp_path_factory.mktemp("hostile") / "state", "--simulate", "dgx-h100").start()
    for _ in range(4):
        server.submit(["sleep", "3600"], gpus=8)
    try:
        yield server
    finally:
        server.stop()
        kill_jobs(server.state_dir)


@pytest.mark.parametrize("path", [p for p in FILES if p.stem.startswith("q_")], ids=lambda p: p.stem)
def test_a_hostile_queue_file_loaded_into_serve_is_detached_and_the_server_keeps_answering(
    queue_server: ServerProcess, path: Path
) -> None:
    server = queue_server
    body = {"filename": path.name, "source": path.read_text()}
    if "rejected" in expected(path):
        answer = server.http.post("/v1/policies", json=body)
        assert answer.status_code == 422, answer.text
        assert queue_slot(server)["builtin"]
        return
    probe = HealthProbe(server.url)
    try:
        rss_before = rss_bytes(server.proc.pid)  # type: ignore[union-attr]
        mark = time.perf_counter()
        answer = server.http.post("/v1/policies", json=body)
        assert answer.status_code == 201, answer.text
        slot = wait_detached(server, queue_slot)
        grown = rss_bytes(server.proc.pid) - rss_before  # type: ignore[union-attr]
        latencies = probe.since(mark)
    finally:
        probe.close()
        server.http.delete("/v1/policies/queue")
    check_faults(path, slot, policy_events(server))
    judge_window(path, latencies)
    assert grown < SLACK_BYTES, f"the server grew {grown / 2**20:.0f} MiB"
    assert len(server.jobs()) == 4  # the queue went on: nothing lost, the running job still runs


@pytest.mark.parametrize("path", [p for p in FILES if p.stem.startswith("p_")], ids=lambda p: p.stem)
def test_a_hostile_placement_file_given_to_serve_is_detached_and_every_job_is_placed(
    tmp_path: Path, path: Path
) -> None:
    server = ServerProcess(tmp_path / "state", "--simulate", "dgx-h100", "--placement", str(path)).start()
    probe = HealthProbe(server.url)
    try:
        rss_before = rss_bytes(server.proc.pid)  # type: ignore[union-attr]
        mark = time.perf_counter()
        ids: list[str] = []
        deadline = time.monotonic() + 1.5 * DETACH_WITHIN_S  # inside pytest-timeout's 300 s, with the start
        # One job at a time, the next once the last is placed: the pace of decisions, not of the clock
        # (on a loaded machine a timeout and the worker's restart take seconds each).
        while not (slot := placement_slot(server))["detached"]:
            assert time.monotonic() < deadline, f"not detached within {1.5 * DETACH_WITHIN_S:g} s: {slot}"
            ids.append(server.submit(["sleep", "3600"], memory="4GiB", compute_percent=10)["id"])
            server.wait(lambda: server.jobs()[ids[-1]]["state"] == "RUNNING", 60, "the job placed")
        server.wait(lambda: all(server.jobs()[i]["state"] == "RUNNING" for i in ids), 60, "every job placed")
        grown = rss_bytes(server.proc.pid) - rss_before  # type: ignore[union-attr]
        latencies = probe.since(mark)
        events = policy_events(server)
    finally:
        probe.close()
        server.stop()
        kill_jobs(server.state_dir)
    check_faults(path, slot, events)
    judge_window(path, latencies)
    assert grown < SLACK_BYTES, f"the server grew {grown / 2**20:.0f} MiB"


def test_health_p99_while_hostile_files_were_loaded_is_under_50_ms() -> None:
    """Runs after the corpus above (file order); alone, there is nothing to judge."""
    if not WINDOWS:
        pytest.skip("no hostile file was loaded in this run (run the whole file)")
    every = sorted(t for latencies in WINDOWS.values() for t in latencies)
    p99 = every[int(0.99 * (len(every) - 1))]
    worst = {name: round(max(t) * 1000) for name, t in WINDOWS.items() if max(t) >= HEALTH_P99_S}
    assert p99 < HEALTH_P99_S, f"p99 {p99 * 1000:.0f} ms over {len(every)} answers; past 50 ms: {worst}"
