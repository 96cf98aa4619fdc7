"""Quotas as serve shows and keeps them: a memory-only share counts what it denies others, a job that can
never meet its quota is refused at submit (422), a quota lowered under a waiting job marks it (reason,
event) and a restart keeps it, and tenants have a route and CLI of their own. The daemon runs over the
fake node on a simulated dgx-h100 (8 × H100)."""

from __future__ import annotations

import warnings

import pytest
from typer.testing import CliRunner

from gpuslice.cli import jobs
from gpuslice.cli.main import app as cli_app
from gpuslice.errors import GpusliceError, exit_code
from gpuslice.node.discovery import discover
from gpuslice.server.app import create_app
from gpuslice.server.client import ServeClient
from gpuslice.server.store import TenantRecord
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, JobState, Priority, RestartPolicy

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # starlette asks for httpx2; httpx works the same here
    from fastapi.testclient import TestClient

TOKEN = "quota-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def dgx(make_daemon):
    return make_daemon(machine=discover("dgx-h100"))


@pytest.fixture
def api(dgx):
    with TestClient(create_app(dgx, TOKEN), headers=AUTH) as client:
        yield client


@pytest.fixture
def cli(dgx, api, monkeypatch):
    monkeypatch.setattr(jobs, "_client", lambda url, state_dir: ServeClient(token=TOKEN, http=api))
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(cli_app, list(args), env={"COLUMNS": "250"})
        if isinstance(result.exception, GpusliceError):  # what main() does with it
            return exit_code(result.exception), f"error: {result.exception}"
        return result.exit_code, result.output

    return run


def share(gib: float, tenant: str = "ml", **fields) -> JobSpec:
    return JobSpec(("train",), gpu_memory_bytes=int(gib * GiB), tenant=tenant, **fields)


def gpu_bytes(daemon) -> int:
    return daemon.machine.gpus[0].memory_bytes


def test_four_memory_only_shares_under_max_gpus_1_only_one_runs_and_usage_is_the_memory_fraction(dgx, api):
    dgx.set_tenant(TenantRecord("ml", max_gpus=1))
    for _ in range(8):  # another team's low-priority whole-GPU jobs fill the machine
        dgx.submit(JobSpec(("serve",), tenant="vision", priority=Priority.LOW))
    dgx.tick()
    gib = 0.675 * gpu_bytes(dgx) / GiB  # 0.675 of a GPU each: four of them held 2.7 GPUs before
    shares = [dgx.submit(share(gib, priority=Priority.HIGH)) for _ in range(4)]
    preempted = set()
    for _ in range(6):  # stopped jobs exit at once; every tick may start or preempt again
        dgx.tick()
        for job in dgx.store.jobs([JobState.RUNNING]):
            if job.stop == "preempt" and job.id not in preempted:
                preempted.add(job.id)
                dgx.node.exit(job.id, 143)
    states = [dgx.store.get(j.id).state for j in shares]
    assert states.count(JobState.RUNNING) == 1, states
    assert len(preempted) == 1, f"ml preempted {sorted(preempted)} beyond its quota of 1 GPU"
    ml = api.get("/v1/tenants/ml").json()
    assert ml["gpus_in_use"] == pytest.approx(0.675, abs=1e-3)
    assert ml["running_jobs"] == 1 and ml["pending_jobs"] == 3 and ml["max_gpus"] == 1
    assert ml["gpu_memory_in_use_bytes"] == int(gib * GiB)


def test_a_submit_that_can_never_fit_its_quota_is_422_with_the_quota_and_the_need(dgx, api, cli):
    dgx.set_tenant(TenantRecord("ml", max_gpus=0.5))
    need = int(0.75 * gpu_bytes(dgx))
    r = api.post("/v1/jobs", json={"command": ["x"], "memory": need, "tenant": "ml"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "0.75 GPUs" in detail and "tenant ml's quota is 0.5 GPUs" in detail
    code, out = cli("submit", "--mem", f"{need}B", "--tenant", "ml", "--", "x")
    assert code == 2 and "tenant ml's quota is 0.5 GPUs" in out, out
    assert dgx.store.jobs() == []


def test_lowering_a_quota_marks_the_waiting_job_in_ps_queue_and_events(dgx, api, cli):
    dgx.set_tenant(TenantRecord("ml", max_gpus=1))
    dgx.submit(JobSpec(("hold",), gpus=8, tenant="vision"))
    job = dgx.submit(share(0.75 * gpu_bytes(dgx) / GiB))
    dgx.tick()
    assert dgx.store.get(job.id).state is JobState.PENDING
    code, out = cli("tenants", "set", "ml", "--max-gpus", "0.5")
    assert code == 0, out
    marked = "can never run under quota 0.5 GPUs of tenant ml"
    events = api.get("/v1/events", params={"job_id": job.id, "kind": "quota"}).json()
    assert len(events) == 1 and events[0]["reason"].startswith(marked)
    dgx.tick()
    assert api.get(f"/v1/jobs/{job.id}").json()["reason"].startswith(marked)
    assert next(e["reason"] for e in api.get("/v1/queue").json() if e["id"] == job.id).startswith(marked)
    code, out = cli("ps")
    assert code == 0 and marked in out
    assert api.get("/v1/tenants/ml").json()["never_fit_jobs"] == [job.id]
    assert dgx.store.get(job.id).state is JobState.PENDING


def test_ps_shows_why_a_pending_job_waits_not_submitted(dgx, cli):
    dgx.submit(JobSpec(("hold",), gpus=8))
    waiting = dgx.submit(JobSpec(("next",), gpus=1))
    dgx.tick()
    code, out = cli("ps")
    line = next(x for x in out.splitlines() if x.split() and x.split()[0] == waiting.id)
    assert code == 0 and "submitted" not in line and "GPU" in line, line


def test_a_restart_keeps_a_job_its_lowered_quota_never_admits_and_says_so(make_daemon):
    first = make_daemon(machine=discover("dgx-h100"))
    first.set_tenant(TenantRecord("ml", max_gpus=2))
    first.submit(JobSpec(("hold",), gpus=8, tenant="vision"))
    job = first.submit(JobSpec(("train",), gpus=2, tenant="ml"))
    first.tick()
    first.set_tenant(TenantRecord("ml", max_gpus=1))
    second = make_daemon(machine=discover("dgx-h100"))
    report = second.recover()
    second.tick()
    assert second.store.get(job.id).state is JobState.PENDING, second.store.get(job.id).reason
    assert report.over_quota == [job.id]
    events = [e for _, e in second.store.events(job.id, kind="quota")]
    assert events[-1].reason.startswith("can never run under quota 1 GPUs of tenant ml: it needs 2 GPUs")
    assert events[-1].reason.endswith("kept waiting after a server restart")
    assert second.views.pending_reasons()[job.id].text.startswith("can never run under quota 1 GPUs")


def test_a_job_requeued_after_its_quota_was_lowered_is_kept_waiting_not_lost(dgx):
    dgx.set_tenant(TenantRecord("ml", max_gpus=2))
    job = dgx.submit(JobSpec(("train",), gpus=2, tenant="ml", restart=RestartPolicy.ON_FAILURE))
    dgx.tick()
    assert dgx.store.get(job.id).state is JobState.RUNNING
    dgx.set_tenant(TenantRecord("ml", max_gpus=1))
    dgx.node.exit(job.id, 1)
    dgx.tick()
    assert dgx.store.get(job.id).state is JobState.PENDING
    assert job.id in [j.id for j, _ in dgx.queue()]  # in the scheduler's queue too, not a ghost


def test_a_requeued_memory_share_counts_its_memory_after_a_quota_change(dgx):
    job = dgx.submit(share(0.75 * gpu_bytes(dgx) / GiB, restart=RestartPolicy.ON_FAILURE))
    dgx.tick()
    dgx.set_tenant(TenantRecord("ml", max_gpus=0.5))
    dgx.node.exit(job.id, 1)
    dgx.tick()
    assert dgx.store.get(job.id).state is JobState.PENDING
    assert dgx.views.pending_reasons()[job.id].text.startswith("can never run under quota 0.5 GPUs")


def test_tenant_route_refuses_bad_input_clearly(api):
    assert api.get("/v1/tenants/nobody").status_code == 404
    assert "gpuslice tenants set nobody" in api.get("/v1/tenants/nobody").json()["detail"]
    assert api.get("/v1/tenants/default").status_code == 200
    assert api.put("/v1/tenants/ml", json={"max_gpus": -1}).status_code == 422
    for bad in ("NaN", "Infinity"):
        body = f'{{"max_gpus": {bad}}}'
        r = api.put("/v1/tenants/ml", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code in (400, 422), r.text
    assert api.get("/v1/tenants/ml").status_code == 404  # nothing was stored


def test_tenants_cli_list_show_set_and_bad_numbers(cli):
    assert cli("tenants", "set", "ml", "--max-gpus", "2", "--weight", "3")[0] == 0
    code, out = cli("tenants", "set", "ml", "--max-gpu-memory", "100GiB")  # the rest stays
    assert code == 0 and "2 GPUs · 100 GiB" in out and "3" in out
    code, out = cli("tenants", "list")
    assert code == 0 and "ml" in out and "default" in out
    code, out = cli("tenants", "show", "ml")
    assert code == 0 and "0 running, 0 pending" in out
    assert cli("tenants", "show", "nobody")[0] == 2
    for bad in ("-1", "nan", "inf", "lots"):
        code, out = cli("tenants", "set", "ml", "--max-gpus", bad)
        assert code == 2 and "--max-gpus" in out, (bad, out)
    assert cli("tenants", "set", "ml", "--weight", "nan")[0] == 2
    code, out = cli("tenants", "set", "ml", "--max-gpus", "none")
    assert code == 0 and "100 GiB" in out and "GPUs ·" not in out


def test_a_pending_job_shows_its_refusal_record_with_the_amounts_behind_its_reason(dgx, api):
    """The API's pending job carries the one refusal record: the code the metrics count and the amounts
    (a quota: GPUs asked, left and the quota; a shortage: GPUs asked, free and usable)."""
    dgx.set_tenant(TenantRecord("ml", max_gpus=1))
    dgx.submit(JobSpec(("a",), tenant="ml"))
    over_quota = dgx.submit(JobSpec(("b",), tenant="ml"))
    dgx.submit(JobSpec(("c",), tenant="vision"))
    too_big = dgx.submit(JobSpec(("d",), tenant="vision", gpus=8))
    dgx.tick()
    quota = api.get(f"/v1/jobs/{over_quota.id}").json()
    assert quota["refusal"] == {"code": "quota", "need": 1, "free": 0, "capacity": 1, "unit": "GPUs"}
    assert "quota of 1 GPUs" in quota["reason"]
    short = api.get(f"/v1/jobs/{too_big.id}").json()
    assert short["refusal"] == {
        "code": "insufficient_gpu",
        "need": 8,
        "free": 6,
        "capacity": 8,
        "unit": "GPUs",
    }
    running = [api.get(f"/v1/jobs/{j.id}").json() for j in dgx.store.jobs([JobState.RUNNING])]
    assert len(running) == 2 and all(j["refusal"] is None for j in running)
