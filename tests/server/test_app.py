"""The REST API over a daemon with a fake node: auth, validation errors that name the field, 404/409,
every read route, logs, and the served OpenAPI schema."""

from __future__ import annotations

import getpass
import warnings

import pytest

from gpuslice.server.app import create_app

with warnings.catch_warnings():
    # starlette asks for its httpx2 fork; the httpx we have works the same for these tests.
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api(daemon):
    """A client that sends the token with every call (reads need it too); a call passes its own
    Authorization header to go without."""
    with TestClient(create_app(daemon, TOKEN), headers=AUTH) as client:
        yield client


def submit(api, **body):
    return api.post("/v1/jobs", json={"command": ["train"], **body}, headers=AUTH)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/v1/jobs", {"command": ["x"]}),
        ("post", "/v1/jobs/1/cancel", None),
        ("put", "/v1/tenants/vision", {"weight": 2}),
    ],
    ids=["submit", "cancel", "put tenant"],
)
@pytest.mark.parametrize(
    "headers", [{"Authorization": ""}, {"Authorization": "Bearer nope"}], ids=["no token", "wrong token"]
)
def test_state_changing_calls_need_the_token(api, method, path, body, headers):
    r = getattr(api, method)(path, json=body, headers=headers) if body else api.post(path, headers=headers)
    assert r.status_code == 401 and r.json()["type"] == "NotAuthenticated"
    assert r.headers["WWW-Authenticate"] == "Bearer"
    assert api.get("/v1/jobs").json() == []


def test_submit_returns_the_pending_job_and_reads_show_it(api, daemon):
    r = submit(api, memory="20GiB", priority="high", tenant="vision", max_runtime="1h")
    assert r.status_code == 201
    job = r.json()
    assert (job["state"], job["priority"], job["tenant"]) == ("PENDING", "high", "vision")
    assert job["spec"]["gpu_memory_bytes"] == 20 * 2**30 and job["spec"]["max_runtime_seconds"] == 3600
    assert job["user"] == getpass.getuser()
    assert api.get(f"/v1/jobs/{job['id']}").json()["id"] == job["id"]
    assert [q["id"] for q in api.get("/v1/queue").json()] == [job["id"]]
    daemon.tick()
    gpus = api.get("/v1/gpus").json()
    assert len(gpus) == 8 and sum(len(g["jobs"]) for g in gpus) == 1
    assert api.get("/v1/jobs", params={"state": "RUNNING"}).json()[0]["id"] == job["id"]
    assert [e["new_state"] for e in api.get("/v1/events", params={"job_id": job["id"]}).json()] == [
        "PENDING",
        "RUNNING",
    ]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"gpus": 99}, 422, "gpus"),
        ({"gpu": 2}, 422, "gpu"),
        ({"priority": "urgent"}, 422, "priority"),
        ({"command": []}, 422, "command"),
        ({"memory": "8GB?"}, 422, "memory"),  # outside the size pattern the schema publishes
        ({"memory": "0GiB"}, 400, "memory"),  # in the pattern; zero bytes is refused for its meaning
        ({"memory": "500GiB"}, 400, "memory"),
        ({"max_runtime": "soon"}, 422, "max_runtime"),
        ({"max_runtime": "0s"}, 400, "max_runtime"),
        ({"mig": "3g.40gb"}, 400, "mig"),
        ({"gpus": 2, "memory": "8GiB"}, 400, "gpus"),
        ({"topology": "nvlink"}, 400, "topology"),
        ({"env": {"A=B": "1"}}, 422, "env"),
    ],
    ids=[
        "too many gpus", "unknown field", "unknown priority", "empty command", "bad size",
        "zero size", "more memory than any GPU", "bad duration", "zero duration",
        "MIG on a machine without MIG", "share of several GPUs", "topology for one GPU", "bad env name",
    ],
)  # fmt: skip
def test_bad_submit_is_a_4xx_naming_the_field_and_stores_nothing(api, body, status, field):
    r = submit(api, **body)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field and r.json()["detail"].startswith(field)
    assert api.get("/v1/jobs").json() == []


def test_submit_claiming_another_user_is_forbidden(api):
    r = submit(api, user="someone-else")
    assert r.status_code == 403 and "never switches users" in r.json()["detail"]
    assert submit(api, user=getpass.getuser()).status_code == 201


def test_unknown_job_is_404_and_cancelling_a_finished_one_is_409(api, daemon, node):
    assert api.get("/v1/jobs/77").status_code == 404
    assert api.post("/v1/jobs/77/cancel", headers=AUTH).status_code == 404
    job = submit(api).json()
    daemon.tick()
    node.exit(job["id"], 0)
    daemon.tick()
    r = api.post(f"/v1/jobs/{job['id']}/cancel", headers=AUTH)
    assert r.status_code == 409 and r.json()["type"] == "JobConflict"


def test_cancel_pending_job(api):
    job = submit(api, gpus=8).json()
    assert api.post(f"/v1/jobs/{job['id']}/cancel", headers=AUTH).json()["state"] == "CANCELLED"


def test_tenants_put_and_get_with_usage(api):
    body = {"weight": 2, "max_gpus": 4, "max_gpu_memory": "160GiB"}
    r = api.put("/v1/tenants/vision", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert (r.json()["max_gpus"], r.json()["max_gpu_memory_bytes"]) == (4, 160 * 2**30)
    names = [t["name"] for t in api.get("/v1/tenants").json()]
    assert "vision" in names and "default" in names
    bad = api.put("/v1/tenants/vision", json={"max_gpu_memory": "lots"}, headers=AUTH)
    assert bad.status_code == 422 and bad.json()["field"] == "max_gpu_memory"  # outside the size pattern
    zero = api.put("/v1/tenants/vision", json={"max_gpu_memory": "0GiB"}, headers=AUTH)
    assert zero.status_code == 400 and zero.json()["field"] == "max_gpu_memory"


def test_logs_return_both_streams(api, daemon, tmp_path):
    job = submit(api).json()
    daemon.tick()
    directory = tmp_path / "jobs" / job["id"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stdout.log").write_text("hello\n")
    (directory / "stderr.log").write_text("warning\n")
    assert api.get(f"/v1/jobs/{job['id']}/logs").text == "hello\nwarning\n"
    assert api.get(f"/v1/jobs/{job['id']}/logs", params={"stream": "stderr"}).text == "warning\n"
    assert api.get("/v1/jobs/404/logs").status_code == 404


def test_follow_ends_when_the_job_has_ended(api, daemon, node, tmp_path):
    job = submit(api).json()
    daemon.tick()
    (tmp_path / "jobs" / job["id"]).mkdir(parents=True, exist_ok=True)
    (tmp_path / "jobs" / job["id"] / "stdout.log").write_text("done\n")
    node.exit(job["id"], 0)
    daemon.tick()
    assert api.get(f"/v1/jobs/{job['id']}/logs", params={"follow": True}).text == "done\n"


def test_health_and_openapi_are_served(api):
    health = api.get("/v1/health").json()
    assert health["status"] == "ok" and health["gpus"] == 8
    schema = api.get("/openapi.json").json()
    routes = {"/v1/jobs", "/v1/jobs/{job_id}/cancel", "/v1/gpus", "/v1/queue", "/v1/tenants"}
    assert routes <= set(schema["paths"])


def test_no_page_loads_scripts_from_a_cdn_and_the_schema_is_served(api):
    assert api.get("/docs").status_code == 404  # Swagger UI would load its scripts from a CDN
    assert api.get("/redoc").status_code == 404
    assert api.get("/openapi.json").json()["info"]["title"] == "gpuslice serve"
