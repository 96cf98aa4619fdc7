"""Acceptance: a real ``gpuslice serve --simulate dgx-h100`` process with real child jobs.

Each test starts its own server (``--grace 2s``) and drives it through the HTTP API only.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

FAKE_LOAD = str(Path(sys.executable).parent / "gpuslice-fake-load")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
pytestmark = pytest.mark.slow


def fake(mem: str = "1GiB", seconds: float = 1.0, *extra: str) -> list[str]:
    return [FAKE_LOAD, "--mem", mem, "--seconds", str(seconds), *extra]


def check_not_overcommitted(gpus: list[dict]) -> None:
    for g in gpus:
        slices = g["jobs"]
        assert g["memory_free_bytes"] >= 0, g
        assert sum(s["memory_bytes"] for s in slices) <= g["memory_total_bytes"], g
        assert sum(s["compute_percent"] for s in slices) <= 100, g
        total = g["memory_total_bytes"]
        whole = [s for s in slices if s["compute_percent"] == 100 and s["memory_bytes"] == total]
        assert not whole or len(slices) == 1, f"a whole-GPU job shares GPU {g['index']}: {slices}"


def starts(server, job_id: str) -> list[tuple[float, list[int]]]:
    events = server.http.get("/v1/events", params={"job_id": job_id}).json()
    return [(e["time"], e["detail"].get("gpus", [])) for e in events if e["new_state"] == "RUNNING"]


def test_fifty_mixed_jobs_never_overcommit_and_keep_priorities_quotas_and_gangs(serve, tmp_path):
    server = serve("--grace", "2s")
    # The capped tenant's jobs run until the test has seen two of them at once, then end: on a loaded
    # machine a fixed 1.5 s job could end between two samples, and "two at once" would go unseen.
    capped_gate = tmp_path / "capped-seen"
    r = server.http.put("/v1/tenants/capped", json={"max_gpus": 2}, headers=server.auth)
    assert r.status_code == 200
    blocker = server.submit(["sleep", "3"], gpus=8, preemptible=False)
    server.wait(lambda: server.jobs()[blocker["id"]]["state"] == "RUNNING", 10, "the blocker to start")
    low8 = server.submit(["sleep", "1"], gpus=8, priority="low")
    high8 = server.submit(["sleep", "1"], gpus=8, priority="high")
    jobs = [low8, high8]
    for i in range(19):  # shares of one GPU: fake loads reporting memory, some with a compute share
        body = {"memory": f"{10 + 5 * (i % 5)}GiB", "priority": ["normal", "low", "idle"][i % 3]}
        if i % 2:
            body["compute_percent"] = 25
        jobs.append(server.submit(fake(f"{5 + i % 5}GiB", 0.5 + (i % 4) * 0.5), **body))
    for i in range(8):  # gangs: 2 or 4 GPUs joined by NVLink, all at once or not at all
        jobs.append(server.submit(["sleep", "1"], gpus=2 + 2 * (i % 2), topology="nvlink"))
    for _ in range(6):  # a tenant capped at 2 GPUs
        gated = f"while [ ! -e {capped_gate} ]; do sleep 0.1; done; sleep 0.5"
        jobs.append(server.submit(["sh", "-c", gated], gpus=1, tenant="capped"))
    for _ in range(8):  # whole single GPUs, exclusive
        jobs.append(server.submit(["sleep", "1"], gpus=1, exclusive=True))
    for _ in range(6):  # fail, restart once, fail again
        failing = ["sh", "-c", "sleep 0.3; exit 3"]
        jobs.append(server.submit(failing, restart="on-failure", max_restarts=1))
    jobs.append(server.submit(["sleep", "0.5"], gpus=1, priority="realtime"))
    assert len(jobs) + 1 == 50 + 1  # the blocker plus fifty mixed jobs

    deadline = time.monotonic() + 180  # ~25 s on an idle 2-CPU machine
    capped_running_max = 0
    while time.monotonic() < deadline:
        check_not_overcommitted(server.http.get("/v1/gpus").json())
        now = server.jobs()
        capped = [j for j in now.values() if j["tenant"] == "capped" and j["state"] == "RUNNING"]
        capped_running_max = max(capped_running_max, len(capped))
        assert sum(1 for j in capped for _ in j["gpus"]) <= 2, capped
        if capped_running_max == 2:
            capped_gate.touch()
        if all(j["state"] in TERMINAL for j in now.values()):
            break
        time.sleep(0.2)
    final = server.jobs()
    assert all(j["state"] in TERMINAL for j in final.values()), {j["id"]: j["state"] for j in final.values()}
    assert len(final) == 51
    assert capped_running_max == 2

    # strict priority: the high 8-GPU job, submitted after the low one, started before it
    assert starts(server, high8["id"])[0][0] < starts(server, low8["id"])[0][0]
    # gangs: every start (a preempted gang starts again later) has every GPU the job asked for
    for job in jobs:
        if job["spec"]["gpus"] >= 2:
            runs = starts(server, job["id"])
            assert runs and all(len(gpus) == job["spec"]["gpus"] for _, gpus in runs), runs
    # restart policy: failing jobs ran twice and kept their exit code
    failing = [j for j in final.values() if j["spec"]["restart"] == "on-failure"]
    assert {(j["state"], j["exit_code"], j["attempts"]) for j in failing} == {("FAILED", 3, 2)}
    assert {j["state"] for j in final.values() if j["spec"]["restart"] == "never"} == {"SUCCEEDED"}


def test_realtime_job_preempts_a_low_one_within_the_grace_period(serve):
    server = serve("--grace", "2s")
    low = server.submit(fake("1GiB", 60, "--ignore-term"), gpus=8, priority="low")
    # Wait for its first line: before it, SIGTERM would find the job still importing, not ignoring it.
    logs = f"/v1/jobs/{low['id']}/logs"
    server.wait(lambda: "fake-load: pid" in server.http.get(logs).text, 15, "the low job to be running")
    submitted = time.time()
    rt = server.submit(fake("1GiB", 1), gpus=1, priority="realtime")
    server.wait(lambda: server.jobs()[rt["id"]]["state"] != "PENDING", 10, "the realtime job to start")
    (started, _), *_ = starts(server, rt["id"])
    assert started - submitted <= 2.0 + 1.0  # grace (the low job ignores SIGTERM) + one tick and a poll
    events = server.http.get("/v1/events", params={"job_id": low["id"]}).json()
    moves = [(e["old_state"], e["new_state"]) for e in events if e["new_state"]]
    assert ("RUNNING", "PREEMPTED") in moves
    assert moves[-1] in {("PREEMPTED", "PENDING"), ("PENDING", "RUNNING")}
    assert server.jobs()[low["id"]]["exit_signal"] == 9  # it ignored SIGTERM, so it got the SIGKILL


def test_a_job_over_its_memory_slice_is_warned_suspended_then_killed(serve):
    server = serve("--grace", "2s")
    settings = {"response": {"suspend_after_seconds": 1, "kill_after_seconds": 3}}
    assert server.http.put("/v1/tenants/greedy", json=settings, headers=server.auth).status_code == 200
    job = server.submit(fake("8GiB", 60, "--grow-to", "20GiB", "--grow-seconds", "0.5"), memory="10GiB",
                        tenant="greedy")  # fmt: skip
    server.wait(lambda: server.jobs()[job["id"]]["state"] == "FAILED", 20, "the greedy job to be killed")
    events = server.http.get("/v1/events", params={"job_id": job["id"]}).json()
    actions = [e["detail"]["action"] for e in events if e["kind"] == "enforcement"]
    assert actions == ["warn", "suspend", "kill"]
    at = {e["detail"]["action"]: e["time"] for e in events if e["kind"] == "enforcement"}
    assert 0.5 <= at["suspend"] - at["warn"] <= 2.5 and 2.5 <= at["kill"] - at["warn"] <= 4.5  # 1 s, 3 s
    final = server.jobs()[job["id"]]
    assert "exceeding its GPU memory slice" in final["reason"] and final["exit_signal"] == 9
