"""Acceptance: a fault injected on a simulated GPU mid-run, against a real
``gpuslice serve --simulate dgx-h100`` process with real child jobs.

No new job lands on the GPU; the job running there is reported (an event of its own, and listed in the
GPU's state); the GPU-level event and the metrics (gpuslice_gpu_healthy, gpuslice_gpu_faults_total)
appear; marked healthy again, the GPU takes the job that waited."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

FAKE_LOAD = str(Path(sys.executable).parent / "gpuslice-fake-load")

pytestmark = [pytest.mark.fault, pytest.mark.slow]


def metric(server, name: str, **labels: str) -> float | None:
    text = server.http.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_a_gpu_marked_unhealthy_mid_run_takes_no_new_job_and_reports_the_running_one(serve):
    server = serve("--grace", "1s")
    victim = server.submit([FAKE_LOAD, "--mem", "10GiB", "--seconds", "60"], gpus=1, tenant="ml")
    server.wait(lambda: server.jobs()[victim["id"]]["state"] == "RUNNING", 10, "the first job to start")
    (gpu,) = server.jobs()[victim["id"]]["gpus"]

    r = server.http.post(
        f"/v1/gpus/{gpu}/health", json={"healthy": False, "reason": "XID 79"}, headers=server.auth
    )
    assert r.status_code == 200, r.text
    state = r.json()
    assert state["healthy"] is False and state["unhealthy_reason"] == "XID 79"
    assert [j["id"] for j in state["jobs"]] == [victim["id"]]  # the running job is listed on the GPU

    others = [server.submit([FAKE_LOAD, "--mem", "1GiB", "--seconds", "60"], gpus=1) for _ in range(8)]
    ids = [o["id"] for o in others]
    server.wait(lambda: sum(server.jobs()[i]["state"] == "RUNNING" for i in ids) == 7, 15, "7 jobs to start")
    jobs = server.jobs()
    assert all(gpu not in jobs[i]["gpus"] for i in ids)  # no new job on the unhealthy GPU
    (left,) = [i for i in ids if jobs[i]["state"] == "PENDING"]
    (queued,) = server.http.get("/v1/queue").json()
    assert queued["id"] == left and f"GPU {gpu} is unhealthy (XID 79)" in queued["reason"]
    assert jobs[victim["id"]]["state"] == "RUNNING"  # the job there keeps running, reported

    events = server.http.get("/v1/events", params={"limit": 10000}).json()
    (gpu_event,) = [e for e in events if e["kind"] == "gpu-health" and not e["job_id"]]
    assert gpu_event["detail"]["gpu"] == gpu and gpu_event["detail"]["jobs"] == [victim["id"]]
    (job_event,) = [e for e in events if e["kind"] == "gpu-health" and e["job_id"] == victim["id"]]
    assert f"GPU {gpu}, which this job runs on, is unhealthy (XID 79)" in job_event["reason"]

    assert metric(server, "gpuslice_gpu_healthy", gpu=str(gpu)) == 0
    assert metric(server, "gpuslice_gpu_healthy", gpu=str((gpu + 1) % 8)) == 1
    assert metric(server, "gpuslice_gpu_faults_total", gpu=str(gpu), kind="manual") == 1
    assert metric(server, "gpuslice_scheduling_failures_total", reason="unhealthy_gpu") >= 1

    r = server.http.post(f"/v1/gpus/{gpu}/health", json={"healthy": True}, headers=server.auth)
    assert r.json()["healthy"] is True
    server.http.post(f"/v1/jobs/{victim['id']}/cancel", headers=server.auth)
    server.wait(lambda: server.jobs()[left]["state"] == "RUNNING", 15, "the waiting job to start")
    assert server.jobs()[left]["gpus"] == [gpu]
