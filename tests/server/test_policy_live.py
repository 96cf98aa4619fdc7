"""Policies as programs on a real ``gpuslice serve --simulate dgx-h100`` process with real child jobs:
hot swap under a stream of concurrent submissions, the guard containing broken policies, and maps an
operator changes with ``gpuslice policy map update`` while the server runs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from policy_sources import (
    BOOST,
    BOOST_FLOAT,
    BOOST_V2,
    BY_TENANT_NAME,
    GARBAGE,
    NEWEST_FIRST,
    RAISES,
    SLOW,
    write,
)

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def load(server, source: str, filename: str) -> dict:
    r = server.http.post(
        "/v1/policies", json={"filename": filename, "source": source}, headers=server.auth, timeout=30
    )
    assert r.status_code == 201, r.text
    return r.json()


def queue_policy(server) -> dict:
    (info,) = [p for p in server.http.get("/v1/policies").json() if p["family"] == "queue"]
    return info


def policy_events(server) -> list[str]:
    return [e["reason"] for e in server.http.get("/v1/events", params={"kind": "policy"}).json()]


def check_no_gpu_ever_overcommitted(server, jobs: dict[str, dict]) -> None:
    """Replay every start and end in event order: no GPU ever held more memory than it has.

    A start is recorded after the scheduler reserved the GPUs and an end before it releases them, so
    the replayed set of running jobs is at every point a subset of what the ledger held."""
    total = {g["index"]: g["memory_total_bytes"] for g in server.http.get("/v1/gpus").json()}
    events = server.http.get("/v1/events", params={"kind": "transition", "limit": 10_000}).json()
    held: dict[int, dict[str, int]] = {g: {} for g in total}
    where: dict[str, list[int]] = {}
    for e in events:
        job = jobs[e["job_id"]]
        if e["new_state"] == "RUNNING":
            where[job["id"]] = e["detail"]["gpus"]
            for g in where[job["id"]]:
                held[g][job["id"]] = job["spec"]["gpu_memory_bytes"] or total[g]
                assert sum(held[g].values()) <= total[g], f"GPU {g} over-committed at event {e['id']}"
        elif e["old_state"] == "RUNNING":
            for g in where.pop(job["id"]):
                del held[g][job["id"]]


def test_hot_swap_under_concurrent_submissions_drops_and_double_places_nothing(serve):
    """Four threads submit 120 short jobs (whole GPUs and 30 GiB shares, five tenants) through the API
    while a fifth loads, swaps and unloads policies as fast as the server answers."""
    server = serve("--grace", "2s")
    programs = [("boost.py", BOOST), ("by_tenant.py", BY_TENANT_NAME), ("boost_v2.py", BOOST_V2),
                ("newest.py", NEWEST_FIRST)]  # fmt: skip
    submitted: list[str] = []
    lock = threading.Lock()
    done = threading.Event()
    swaps = Counter()

    def submitter(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30, headers=server.auth) as http:
            for i in range(30):
                body = {"command": ["sleep", "0.2"], "tenant": f"t{(n + i) % 5}", "restart": "never"}
                if i % 3 == 0:
                    body["memory"] = "30GiB"  # a share: two or more fit on one GPU
                r = http.post("/v1/jobs", json=body)
                assert r.status_code == 201, r.text
                with lock:
                    submitted.append(r.json()["id"])

    def swapper() -> None:
        i = 0
        while not done.is_set():
            if i % 5 == 4:
                r = server.http.delete("/v1/policies/queue", headers=server.auth)
                assert r.status_code == 200, r.text
                swaps["unload"] += 1
            else:
                name, source = programs[i % 5]
                load(server, source, name)
                swaps["load"] += 1
                if "boost" in name:
                    r = server.http.put(
                        "/v1/policies/queue/maps/boost/t3", json={"value": 1}, headers=server.auth
                    )
                    assert r.status_code == 200, r.text
            i += 1

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(4)]
    swap_thread = threading.Thread(target=swapper)
    swap_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        server.wait(
            lambda: all(j["state"] in TERMINAL for j in server.jobs().values()), 180, "every job to finish"
        )
    finally:
        done.set()
        swap_thread.join()

    jobs = server.jobs()
    assert sorted(submitted, key=int) == sorted(jobs, key=int) and len(jobs) == 120  # none lost
    assert {j["state"] for j in jobs.values()} == {"SUCCEEDED"}
    events = server.http.get("/v1/events", params={"kind": "transition", "limit": 10_000}).json()
    starts = Counter(e["job_id"] for e in events if e["new_state"] == "RUNNING")
    assert starts == Counter({job_id: 1 for job_id in jobs})  # each started exactly once
    check_no_gpu_ever_overcommitted(server, jobs)
    assert swaps["load"] >= 10 and swaps["unload"] >= 2
    loaded = [e for e in policy_events(server) if " loaded from " in e]
    assert len(loaded) == swaps["load"]


@pytest.mark.parametrize(
    ("source", "reasons"),
    [(RAISES, {"exception"}), (GARBAGE, None), (SLOW, {"timeout", "overrun"})],
    ids=["raises", "returns garbage", "overruns its budget"],
)
def test_a_broken_policy_on_a_live_server_is_contained_and_detached(serve, source, reasons):
    server = serve("--grace", "2s")
    load(server, source, "broken.py")
    # Jobs that wait behind each other, so that every pass asks the policy to order a queue. A hook past
    # its budget gets its worker process killed; passes while a fresh one starts are decided by the
    # default without a fault ("restarting"), so such a policy needs more passes to reach 5 faults.
    ids: list[str] = []
    deadline = time.monotonic() + 120
    while not queue_policy(server)["detached"]:
        assert time.monotonic() < deadline, f"never detached: {queue_policy(server)}"
        if all(server.jobs()[i]["state"] in TERMINAL for i in ids):
            ids += [server.submit(["sleep", "0.3"], gpus=8, tenant=f"t{n}")["id"] for n in range(3)]
        time.sleep(0.2)
    server.wait(lambda: all(server.jobs()[i]["state"] == "SUCCEEDED" for i in ids), 60, "the jobs to run")

    info = queue_policy(server)
    assert info["detached"] is True and info["builtin"] is False  # still listed, marked detached
    faults = [f for f in info["faults"] if f["reason"] != "restarting"]  # one row per (hook, reason)
    assert {f["hook"] for f in info["faults"]} == {"order_key"}
    assert sum(f["count"] for f in faults) == 5  # GuardConfig().max_faults, then no more
    assert reasons is None or {f["reason"] for f in faults} <= reasons
    events = policy_events(server)
    assert sum("the default decided" in e for e in events) == 5 and any("detached" in e for e in events)
    # once detached the default decides: later jobs run, and no further fault is counted
    late = server.submit(["true"], gpus=2)["id"]
    server.wait(lambda: server.jobs()[late]["state"] == "SUCCEEDED", 30, "a job after the detach")
    assert queue_policy(server)["faults"] == info["faults"]


def gpuslice(server, *args: str) -> subprocess.CompletedProcess[str]:
    where = ["--url", server.url, "--state-dir", str(server.state_dir)]
    command = [str(BIN / "gpuslice"), "policy", *args, *where]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def test_map_update_from_the_cli_changes_the_order_and_survives_a_swap_with_the_same_map(
    serve, tmp_path: Path
):
    server = serve("--grace", "2s")
    result = gpuslice(server, "load", str(write(tmp_path, "boost.py", BOOST)))
    assert result.returncode == 0, result.stderr
    # The blocker holds every GPU, so the two jobs after it queue. (Memory that processes outside this
    # server hold, e.g. other test runs' fake loads, may keep even the blocker waiting: then all three
    # queue, which serves as well. It is not preemptible, so a boosted job cannot push it out.)
    # 600 s, cancelled at the end: under a load of 25 the CLI calls below took over 60 s, and a 60 s
    # blocker ended, emptying the queue the test reads.
    blocker = server.submit(["sleep", "600"], gpus=8, preemptible=False)["id"]
    ml = server.submit(["true"], gpus=8, tenant="ml")["id"]
    vision = server.submit(["true"], gpus=8, tenant="vision")["id"]

    def order() -> list[str]:
        return [q["id"] for q in server.http.get("/v1/queue").json() if q["id"] in (ml, vision)]

    server.wait(lambda: order() == [ml, vision], 10, "FIFO order")
    result = gpuslice(server, "map", "update", "boost", "vision", "1")
    assert result.returncode == 0 and result.stdout.strip() == "boost['vision'] = 1", result.stderr
    server.wait(lambda: order() == [vision, ml], 10, "vision's boost to reorder the queue")

    result = gpuslice(server, "load", str(write(tmp_path, "boost_v2.py", BOOST_V2)))
    assert result.returncode == 0 and "boost (1 entry)" in result.stdout, result.stderr
    assert gpuslice(server, "map", "get", "boost", "vision").stdout.strip() == "1"
    time.sleep(0.5)  # a few passes under the new version
    assert order() == [vision, ml]

    result = gpuslice(server, "load", str(write(tmp_path, "boost_float.py", BOOST_FLOAT)))
    assert result.returncode == 0 and "boost (0 entries)" in result.stdout
    server.wait(lambda: order() == [ml, vision], 10, "FIFO again with a fresh map")
    result = gpuslice(server, "map", "get", "boost", "vision")
    assert result.returncode == 2 and "has no key 'vision'" in result.stderr

    result = gpuslice(server, "list")
    assert result.returncode == 0 and "tenant-boost-float" in result.stdout
    for job in (vision, ml, blocker):
        assert server.http.post(f"/v1/jobs/{job}/cancel", headers=server.auth).status_code == 200
