"""Hostile requests and crash corners of the API and the daemon, in this process (a fake node).

Each test names the defect it guards against: a request that must be a clear 4xx and leave the store as
it was, or a daemon decision that must hold after a crash.
"""

from __future__ import annotations

import asyncio
import json
import warnings

import pytest
from server_helpers import FakeNode

from gpuslice.node.launcher import ExitStatus
from gpuslice.server.app import create_app
from gpuslice.server.guard import Guard, cookie_value, host_name
from gpuslice.server.models import ENV_MASK
from gpuslice.workload.job import JobSpec, JobState, RestartPolicy

with warnings.catch_warnings():
    # starlette asks for its httpx2 fork; the httpx we have works the same for these tests.
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

TOKEN = "hardening-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NO_AUTH = {"Authorization": ""}


@pytest.fixture
def app(daemon):
    return create_app(daemon, TOKEN)


@pytest.fixture
def api(app):
    with TestClient(app, headers=AUTH) as client:
        yield client


def post_raw(api, text: str, path: str = "/v1/jobs"):
    return api.post(path, content=text.encode(), headers={**AUTH, "Content-Type": "application/json"})


def submit(api, headers=None, **body):
    return api.post("/v1/jobs", json={"command": ["train"], **body}, headers=headers or AUTH)


# -- text fields: valid Unicode, bounded, before anything is stored --------------------------------------

LONE = '"\\ud800"'  # a JSON escape Python decodes to a lone surrogate


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"command": [' + LONE + "]}", "command.0"),
        ('{"command": ["sh", ' + LONE + "]}", "command.1"),
        ('{"command": ["x"], "env": {"A": ' + LONE + "}}", "env"),
        ('{"command": ["x"], "env": {' + LONE + ': "1"}}', "env"),
        ('{"command": ["x"], "cwd": ' + LONE + "}", "cwd"),
        ('{"command": ["x"], "gpu_models": [' + LONE + "]}", "gpu_models.0"),
    ],
    ids=["program", "argument", "env value", "env name", "cwd", "gpu model"],
)
def test_a_lone_surrogate_is_a_422_naming_the_field_and_stores_nothing(api, body, field):
    r = post_raw(api, body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field and r.json()["type"] == "ValidationError"
    assert api.get("/v1/jobs").json() == []


def test_a_stored_job_with_a_lone_surrogate_does_not_break_the_job_list(api, daemon):
    """A store written before the check (by an older server) may hold one; every read still answers."""
    daemon.submit(JobSpec(command=("echo", "\ud800"), env=(("A", "\udfff"),), user="u"))
    jobs = api.get("/v1/jobs")
    assert jobs.status_code == 200 and jobs.json()[0]["command"] == ["echo", "\ufffd"]
    assert api.get(f"/v1/jobs/{jobs.json()[0]['id']}").status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command": ["x", "a" * (128 * 1024 + 1)]}, "command.1"),
        ({"command": ["x", "é" * (64 * 1024 + 1)]}, "command.1"),  # 2 bytes each in UTF-8
        ({"command": ["x"], "env": {f"V{i}": "1" for i in range(1025)}}, "env"),
        ({"command": ["x"], "env": {"V": "a" * (128 * 1024 + 1)}}, "env"),
        ({"command": ["x"] + ["a" * 100_000] * 11}, "command"),  # each fine, 1.1 MB together
        ({"command": ["x"], "cwd": "/" * 4097}, "cwd"),
        ({"command": [""]}, "command"),
    ],
    ids=["long argument", "long in UTF-8", "too many variables", "long env value", "too much in all",
         "long cwd", "empty program"],
)  # fmt: skip
def test_text_over_its_limit_is_a_422_naming_the_field_and_stores_nothing(api, body, field):
    r = api.post("/v1/jobs", json=body)
    assert r.status_code == 422 and r.json()["field"] == field, r.text[:300]  # as the schema says
    assert api.get("/v1/jobs").json() == []


# -- numbers: strict, finite, within what SQLite and Python hold ----------------------------------------


@pytest.mark.parametrize(
    ("path", "text", "field"),
    [
        ("/v1/jobs", '{"command": ["x"], "memory": 1e400}', "memory"),
        ("/v1/jobs", '{"command": ["x"], "memory": "' + ("9" * 400) + 'TiB"}', "memory"),
        ("/v1/jobs", '{"command": ["x"], "memory": true}', "memory"),
        ("/v1/jobs", '{"command": ["x"], "gpus": true}', "gpus"),
        ("/v1/jobs", '{"command": ["x"], "max_runtime": NaN}', "max_runtime"),
        ("/v1/jobs", '{"command": ["x"], "max_runtime": Infinity}', "max_runtime"),
        ("/v1/tenants/t", '{"max_gpu_memory": 9223372036854775808}', "max_gpu_memory"),
        ("/v1/tenants/t", '{"weight": NaN}', "weight"),
        ("/v1/tenants/t", '{"response": {"kill_after_seconds": NaN}}', "response"),
        ("/v1/tenants/t", '{"response": {"kill_after_seconds": Infinity}}', "response"),
        ("/v1/tenants/t", '{"response": {"suspend_after_seconds": true}}', "response"),
    ],
    ids=["memory 1e400", "memory of 400 digits", "memory true", "gpus true", "runtime NaN",
         "runtime Infinity",
         "tenant memory 2^63", "weight NaN", "timing NaN", "timing Infinity", "timing true"],
)  # fmt: skip
def test_numbers_that_are_not_numbers_or_too_big_are_4xx_never_500(api, path, text, field):
    r = (api.put if "tenants" in path else api.post)(
        path, content=text.encode(), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert 400 <= r.status_code < 500 and r.json()["field"] == field, r.text[:300]
    assert api.get("/v1/jobs").json() == []
    assert [t["name"] for t in api.get("/v1/tenants").json()] == ["default"]


# -- the front door: token before body, body cap, Host, reads ------------------------------------------


def asgi_call(guard: Guard, method: str, path: str, headers: dict[str, str], chunks: list[bytes]):
    """Drive ``guard`` with one request; returns (status, body, how many body chunks it read)."""
    reads = 0
    sent: list[dict] = []

    async def receive():
        nonlocal reads
        reads += 1
        if reads <= len(chunks):
            return {"type": "http.request", "body": chunks[reads - 1], "more_body": reads < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):  # the routes: answers 200 after reading the whole body
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    guard.app = app
    scope = {
        "type": "http", "method": method, "path": path, "query_string": b"", "server": ("127.0.0.1", 8787),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }  # fmt: skip
    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"], sent[1]["body"], reads


def guard(**kw) -> Guard:
    return Guard(lambda *a: None, token=TOKEN, sign_in_token="once", hosts=kw.pop("hosts", None), **kw)


def test_a_write_without_the_token_is_refused_before_its_body_is_read():
    status, body, reads = asgi_call(guard(), "POST", "/v1/jobs", {}, [b"x" * 65536] * 5000)
    assert (status, json.loads(body)["type"], reads) == (401, "NotAuthenticated", 0)


def test_a_body_over_the_cap_is_413_and_is_not_read_past_the_cap():
    g = guard(max_body_bytes=1000)
    status, body, reads = asgi_call(g, "POST", "/v1/jobs", {**AUTH, "Content-Length": "5000"}, [b"x" * 5000])
    assert (status, json.loads(body)["type"], reads) == (413, "BodyTooLarge", 0)
    # chunked, no length: read up to the cap, not one chunk more
    status, _, reads = asgi_call(g, "POST", "/v1/jobs", AUTH, [b"x" * 400] * 100)
    assert (status, reads) == (413, 3)
    status, body, _ = asgi_call(g, "POST", "/v1/jobs", AUTH, [b"x" * 400, b"y" * 400])
    assert (status, body) == (200, b"x" * 400 + b"y" * 400)  # under the cap: the route gets it all


def test_a_host_that_is_not_the_servers_is_refused():
    """DNS rebinding: a page on another name that resolves to 127.0.0.1 arrives with its own Host."""
    g = guard(hosts={"127.0.0.1", "localhost", "::1"})
    for host in ("evil.example", "evil.example:8787", "127.0.0.1.evil.example"):
        status, body, _ = asgi_call(g, "GET", "/v1/health", {"Host": host}, [])
        assert (status, json.loads(body)["type"]) == (400, "HostNotAllowed"), host
    for host in ("127.0.0.1:8787", "localhost", "[::1]:8787", "LOCALHOST:1"):
        assert asgi_call(g, "GET", "/v1/health", {"Host": host}, [])[0] == 200, host
    assert asgi_call(guard(hosts={"*"}), "GET", "/v1/health", {"Host": "proxy.example"}, [])[0] == 200
    assert host_name("[::1]:80") == "::1" and host_name("Example.ORG") == "example.org"


@pytest.mark.parametrize(
    "path",
    ["/v1/jobs", "/v1/jobs/1", "/v1/jobs/1/logs", "/v1/gpus", "/v1/queue", "/v1/events", "/v1/tenants"],
)
def test_reads_need_the_token_but_health_metrics_and_the_page_do_not(api, path):
    submit(api)
    r = api.get(path, headers=NO_AUTH)
    assert r.status_code == 401 and r.json()["type"] == "NotAuthenticated" and "token" in r.json()["detail"]
    for wrong in (f"Bearer {TOKEN}x", "Bearer x", f"Basic {TOKEN}"):  # any token is not the token
        r = api.get(path, headers={"Authorization": wrong})
        assert r.status_code == 401 and r.json()["type"] == "NotAuthenticated", wrong
    assert api.get(path).status_code == 200
    for open_path in ("/v1/health", "/metrics", "/", "/dashboard/dashboard.js", "/openapi.json"):
        assert api.get(open_path, headers=NO_AUTH).status_code == 200, open_path


def test_public_reads_opens_reads_but_not_writes(daemon):
    with TestClient(create_app(daemon, TOKEN, public_reads=True)) as client:
        assert client.get("/v1/jobs").status_code == 200
        assert client.post("/v1/jobs", json={"command": ["x"]}).status_code == 401


def test_the_sign_in_link_works_once_and_leaves_a_read_only_cookie(daemon):
    app = create_app(daemon, TOKEN, sign_in_token="one-time")
    with TestClient(app, follow_redirects=False) as client:
        r = client.get("/?token=one-time")
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
        assert cookie_value(TOKEN) in cookie
        assert client.get("/v1/jobs").status_code == 200  # the cookie jar sends it
        assert client.post("/v1/jobs", json={"command": ["x"]}).status_code == 401  # reads only
    with TestClient(app, follow_redirects=False) as other:
        assert other.get("/?token=one-time").status_code == 401  # used up
        assert other.get("/v1/jobs").status_code == 401
        assert other.get(f"/?token={TOKEN}").status_code == 303  # the token itself always signs in


def test_env_values_are_never_returned(api):
    job = submit(api, env={"HF_TOKEN": "hf_secret", "MODE": "fast"}).json()
    assert job["spec"]["env"] == {"HF_TOKEN": ENV_MASK, "MODE": ENV_MASK}
    for r in (api.get(f"/v1/jobs/{job['id']}"), api.get("/v1/jobs")):
        assert "hf_secret" not in r.text and "fast" not in r.text


# -- error bodies in the one documented format ----------------------------------------------------------


def test_parse_errors_unknown_paths_and_wrong_methods_answer_the_error_format(api):
    r = post_raw(api, "{not json")
    assert r.status_code == 400 and r.json()["type"] == "InvalidJSON" and r.json()["field"] is None
    r = api.get("/v1/nothing-here")
    assert (
        r.status_code == 404 and r.json()["type"] == "NotFound" and "/v1/nothing-here" in r.json()["detail"]
    )
    r = api.delete("/v1/jobs")
    assert r.status_code == 405 and r.json()["type"] == "MethodNotAllowed"
    assert r.headers["Allow"] == "GET, POST"  # both routes on that path, not the first one's
    r = api.head("/v1/jobs")  # not served, so not claimed in Allow either
    assert r.status_code == 405 and r.headers["Allow"] == "GET, POST"
    r = api.put("/v1/jobs/1/cancel")
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    # routes of every router: the policy routes have their own prefix, the tenants' a path parameter
    wrong = [("DELETE", "/v1/policies", "GET, POST"), ("PATCH", "/v1/tenants/t", "GET, PUT"),
             ("POST", "/v1/gpus", "GET")]  # fmt: skip
    for method, path, allow in wrong:
        r = api.request(method, path)
        assert (r.status_code, r.headers["Allow"]) == (405, allow), (method, path)


def test_the_schema_shows_the_limits_the_server_enforces(api):
    schema = api.get("/openapi.json").json()["components"]["schemas"]["SubmitRequest"]["properties"]
    assert schema["command"]["minItems"] == 1 and schema["command"]["prefixItems"][0]["minLength"] == 1
    assert schema["command"]["items"]["maxLength"] == 128 * 1024
    assert schema["env"]["maxProperties"] == 1024
    assert schema["cwd"]["maxLength"] == 4096


# -- idempotent submit -------------------------------------------------------------------------------


def test_the_same_idempotency_key_returns_the_same_job(api):
    first = submit(api, headers={**AUTH, "Idempotency-Key": "k-1"})
    again = submit(api, headers={**AUTH, "Idempotency-Key": "k-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    other = submit(api, headers={**AUTH, "Idempotency-Key": "k-1"}, gpus=2)
    assert other.status_code == 409 and other.json()["type"] == "JobConflict"
    assert submit(api, headers={**AUTH, "Idempotency-Key": "k 2"}).status_code in (400, 422)
    assert len(api.get("/v1/jobs").json()) == 1


# -- the daemon after crashes -------------------------------------------------------------------------


class RecordingNode(FakeNode):
    """Notes the job's stored state at each kill: it must still say RUNNING (the kill comes first)."""

    def __init__(self) -> None:
        super().__init__()
        self.daemon = None
        self.states_at_kill: list[JobState] = []

    def kill(self, pgid: int) -> bool:
        job = next(j for j, launched in self.launched.items() if launched.pgid == pgid)
        self.states_at_kill.append(self.daemon.store.get(job).state)
        return super().kill(pgid)


@pytest.fixture
def recording(tmp_path, clock):
    from server_helpers import h100_machine

    from gpuslice.server.daemon import Daemon
    from gpuslice.server.store import Store

    node = RecordingNode()
    store = Store(tmp_path / "state.db")
    daemon = Daemon(
        store, h100_machine(), node, tmp_path, clock=clock, grace_seconds=2.0, monitor_seconds=0.0
    )
    node.daemon = daemon
    yield daemon, node
    store.close()


def test_a_lost_supervisors_group_is_killed_before_the_job_is_marked_lost_or_restarted(recording):
    daemon, node = recording
    job = daemon.submit(JobSpec(command=("train",), restart=RestartPolicy.ON_FAILURE, user="u"))
    daemon.tick()
    pgid = node.launched[job.id].pgid
    node.alive.discard(pgid)  # kill -9 of the supervisor: no exit record, its command may still run
    daemon.tick()
    assert ("kill", pgid) in node.signals and node.states_at_kill == [JobState.RUNNING]
    after = daemon.store.get(job.id)
    assert after.state is JobState.RUNNING and after.attempts == 2  # restarted only after the kill
    assert "lost" in daemon.store.events(job.id)[-3][1].reason


def test_a_job_lost_while_the_server_was_down_is_killed_before_it_is_marked(recording, make_daemon):
    daemon, node = recording
    job = daemon.submit(JobSpec(command=("train",), user="u"))
    daemon.tick()
    pgid = node.launched[job.id].pgid
    node.alive.discard(pgid)
    report = daemon.recover()  # what a restart does first
    assert report.lost == [job.id] and ("kill", pgid) in node.signals
    assert node.states_at_kill == [JobState.RUNNING]


def test_an_exit_record_of_an_earlier_attempt_is_not_taken_for_this_one(daemon, node, clock):
    """The server died after storing attempt 2 as RUNNING and before the launch removed attempt 1's
    exit record: attempt 2 never started, it must not end with attempt 1's exit code."""
    job = daemon.submit(JobSpec(command=("train",), user="u"))
    daemon.tick()
    daemon.store.update(job.id, pid=None, pgid=None, proc_start_time=None, started_at=clock.now)
    node.alive.clear()
    node.exits[job.id] = ExitStatus(3, None, clock.now - 50, started_at=clock.now - 100)
    report = daemon.recover()
    assert report.lost == [job.id]
    after = daemon.store.get(job.id)
    assert after.state is JobState.FAILED and after.exit_code is None and "lost" in after.reason
    # a record of this attempt (it started after the attempt was stored) is taken as usual
    job2 = daemon.submit(JobSpec(command=("train",), user="u"))
    daemon.tick()
    node.exits[job2.id] = ExitStatus(4, None, clock.now + 2, started_at=clock.now + 1)
    node.alive.discard(node.launched[job2.id].pid)  # its supervisor wrote the record and ended
    daemon.tick()
    assert (daemon.store.get(job2.id).state, daemon.store.get(job2.id).exit_code) == (JobState.FAILED, 4)


def test_gpu_health_marks_survive_a_restart(make_daemon, node):
    first = make_daemon()
    first.set_gpu_health(3, False, "XID 79")
    second = make_daemon()  # the same store, as after a restart
    second.recover()
    assert not second.watch.health[3].healthy and second.watch.health[3].reason == "XID 79"
    assert second.scheduler.unhealthy_gpus() == {3: "XID 79"}
    job = second.submit(JobSpec(command=("train",), gpus=8, user="u"))
    second.tick()
    assert second.store.get(job.id).state is JobState.PENDING  # 7 healthy GPUs cannot hold it
    second.set_gpu_health(3, True, "")
    third = make_daemon()
    assert third.watch.health[3].healthy
