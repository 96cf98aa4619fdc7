"""Policies as programs on a running daemon, through the REST API (in process, fake node): the server
verifies what it loads, swaps between scheduling passes, keeps and carries maps, contains faulty
policies with the guard, and refuses changes without the token."""

from __future__ import annotations

import hashlib
import random
import sys
import threading
import time
import warnings
from collections import Counter

import pytest
from policy_sources import (
    BOOST,
    BOOST_FLOAT,
    BOOST_V2,
    BY_TENANT_NAME,
    GARBAGE,
    INIT_FAILS,
    NEWEST_FIRST,
    RAISES,
    REJECTED,
    write,
)

from gpuslice.programs.guard import GuardConfig
from gpuslice.programs.loader import load_source
from gpuslice.server.app import create_app
from gpuslice.workload.job import JobSpec, JobState

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # starlette asks for httpx2; httpx works the same here
    from fastapi.testclient import TestClient

TOKEN = "policy-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_FAULTS = 3


@pytest.fixture
def daemon(make_daemon):
    return make_daemon(guard=GuardConfig(max_faults=MAX_FAULTS))


@pytest.fixture
def api(daemon):
    with TestClient(create_app(daemon, TOKEN), headers=AUTH) as client:
        yield client


def load(api, source: str, filename: str = "policy.py"):
    return api.post("/v1/policies", json={"filename": filename, "source": source}, headers=AUTH)


def submit(api, tenant: str, gpus: int = 8, **body) -> str:
    r = api.post(
        "/v1/jobs", json={"command": ["train"], "gpus": gpus, "tenant": tenant, **body}, headers=AUTH
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def queue_ids(api) -> list[str]:
    return [q["id"] for q in api.get("/v1/queue").json()]


def policy_events(api) -> list[str]:
    return [e["reason"] for e in api.get("/v1/events", params={"kind": "policy"}).json()]


def queue_policy(api) -> dict:
    (info,) = [p for p in api.get("/v1/policies").json() if p["family"] == "queue"]
    return info


def test_before_any_load_the_builtin_queue_policy_is_listed(api):
    info = queue_policy(api)
    assert (info["family"], info["name"], info["builtin"]) == ("queue", "priority-fair", True)
    assert info["sha256"] is None and info["source"] is None and info["detached"] is False
    assert info["faults"] == [] and info["maps"] == []


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/v1/policies", {"filename": "p.py", "source": BOOST}),
        ("delete", "/v1/policies/queue", None),
        ("put", "/v1/policies/queue/maps/boost/ml", {"value": 1}),
        ("delete", "/v1/policies/queue/maps/boost/ml", None),
    ],
    ids=["load", "unload", "map update", "map delete"],
)
@pytest.mark.parametrize(
    "headers", [{"Authorization": ""}, {"Authorization": "Bearer nope"}], ids=["no token", "wrong token"]
)
def test_policy_changes_need_the_token(api, method, path, body, headers):
    assert load(api, BOOST).status_code == 201
    api.put("/v1/policies/queue/maps/boost/ml", json={"value": 2}, headers=AUTH)
    r = api.request(method.upper(), path, json=body, headers=headers)
    assert r.status_code == 401 and r.json()["type"] == "NotAuthenticated"
    info = queue_policy(api)
    assert info["name"] == "tenant-boost"  # still the one loaded with the token
    assert api.get("/v1/policies/queue/maps/boost/ml").json()["value"] == 2


def test_the_server_verifies_the_source_and_lists_every_violation(api, daemon):
    before = daemon.scheduler.policy
    r = load(api, REJECTED, "sneaky.py")
    assert r.status_code == 422
    body = r.json()
    assert body["type"] == "PolicyRejected"
    summary, *violations = body["detail"].splitlines()
    assert "sneaky.py" in summary and "2 violation" in summary
    assert [v.split(": ", 1)[0] for v in violations] == ["sneaky.py:2", "sneaky.py:11"]
    assert "import of 'os'" in violations[0] and "while" in violations[1]
    assert queue_policy(api)["builtin"] is True and daemon.scheduler.policy is before
    assert policy_events(api) == []


def test_load_swaps_the_policy_in_and_unload_restores_the_builtin(api, daemon):
    r = load(api, BOOST, "boost.py")
    assert r.status_code == 201, r.text
    info = r.json()
    assert (info["family"], info["name"], info["builtin"], info["source"]) == (
        "queue", "tenant-boost", False, "boost.py"
    )  # fmt: skip
    assert info["sha256"] == hashlib.sha256(BOOST.encode()).hexdigest() and info["loaded_at"] is not None
    assert [(m["name"], m["key_type"], m["value_type"], m["max_entries"]) for m in info["maps"]] == [
        ("boost", "str", "int", 64)
    ]
    # the scheduler decides with it
    assert daemon.scheduler.policy is daemon.policy_admin.slots["queue"].current
    assert queue_policy(api) == info

    r = api.delete("/v1/policies/queue", headers=AUTH)
    assert r.status_code == 200 and (r.json()["name"], r.json()["builtin"]) == ("priority-fair", True)
    assert daemon.scheduler.policy is daemon.policy_admin.slots["queue"].current
    events = policy_events(api)
    assert len(events) == 2 and "tenant-boost" in events[0] and "tenant-boost" in events[1]


def test_a_policy_whose_init_fails_is_refused_and_the_running_one_stays(api, daemon):
    assert load(api, BOOST, "boost.py").status_code == 201
    api.put("/v1/policies/queue/maps/boost/ml", json={"value": 1}, headers=AUTH)
    running = daemon.scheduler.policy
    r = load(api, INIT_FAILS, "init.py")
    assert r.status_code == 400 and "failed in __init__: ZeroDivisionError" in r.json()["detail"]
    info = queue_policy(api)
    assert info["name"] == "tenant-boost" and daemon.scheduler.policy is running
    assert api.get("/v1/policies/queue/maps/boost/ml").json()["value"] == 1


def test_serve_queue_policy_file_starts_with_it_and_unload_gives_the_builtin(make_daemon, tmp_path):
    path = write(tmp_path, "boost.py", BOOST)
    daemon = make_daemon(queue_policy=str(path))
    info, placement = daemon.policy_admin.policies()
    assert placement == {**placement, "family": "placement", "builtin": True}
    assert (info["name"], info["source"], info["builtin"]) == ("tenant-boost", str(path), False)
    assert daemon.scheduler.policy is daemon.policy_admin.slots["queue"].current
    assert daemon.policy_admin.unload_policy("queue")["name"] == "priority-fair"


def test_a_policy_of_a_family_the_server_does_not_run_is_refused(api):
    placement = '''"""Spread."""
from gpuslice.programs.api import PlacementOps


class Spread(PlacementOps):
    name = "spread-file"
'''
    r = load(api, placement, "spread.py")
    assert r.status_code == 400 and "queue" in r.json()["detail"]
    assert queue_policy(api)["builtin"] is True
    r = api.delete("/v1/policies/placement", headers=AUTH)
    assert r.status_code == 404 and "fixed at the server's start" in r.json()["detail"]


def test_a_map_update_changes_the_order_on_the_running_server(api, daemon):
    assert load(api, BOOST).status_code == 201
    submit(api, "big")  # takes all 8 GPUs
    daemon.tick()
    first, second = submit(api, "ml"), submit(api, "vision")
    daemon.tick()
    assert queue_ids(api) == [first, second]  # same level: FIFO

    r = api.put("/v1/policies/queue/maps/boost/vision", json={"value": "1"}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"family": "queue", "map": "boost", "key": "vision", "value": 1, "previous": None}
    daemon.tick()
    assert queue_ids(api) == [second, first]  # vision's job goes first now

    daemon.node.exit("1")
    daemon.tick()
    assert daemon.store.get(second).state.value == "RUNNING"
    assert daemon.store.get(first).state.value == "PENDING"
    dump = api.get("/v1/policies/queue/maps/boost").json()
    assert dump["entries"] == [["vision", 1]] and (dump["key_type"], dump["value_type"]) == ("str", "int")
    assert api.get("/v1/policies/queue/maps/boost/vision").json()["value"] == 1
    r = api.delete("/v1/policies/queue/maps/boost/vision", headers=AUTH)
    assert r.status_code == 200 and (r.json()["key"], r.json()["value"]) == ("vision", 1)
    assert api.get("/v1/policies/queue/maps/boost/vision").status_code == 404
    assert api.delete("/v1/policies/queue/maps/boost/vision", headers=AUTH).status_code == 404


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/policies/queue/maps/boost/ml", {"value": "lots"}, 400, "'lots' is not a int"),
        ("/v1/policies/queue/maps/boost/ml", {"value": 1.5}, 400, "is a float"),
        ("/v1/policies/queue/maps/boost/ml", {"value": True}, 400, "is a bool"),
        ("/v1/policies/queue/maps/nosuch/ml", {"value": 1}, 404, "no map 'nosuch'; its maps: boost"),
        ("/v1/policies/fleet/maps/boost/ml", {"value": 1}, 404, "runs no fleet policy"),
    ],
    ids=["text not an int", "float for int", "bool for int", "unknown map", "unknown family"],
)
def test_map_updates_are_typed_and_a_bad_one_changes_nothing(api, path, body, status, words):
    assert load(api, BOOST).status_code == 201
    r = api.put(path, json=body, headers=AUTH)
    assert r.status_code == status and words in r.json()["detail"], r.text
    assert api.get("/v1/policies/queue/maps/boost").json()["entries"] == []


def test_reading_a_missing_key_or_map_is_404_and_the_builtin_has_no_maps(api):
    r = api.get("/v1/policies/queue/maps/boost")
    assert r.status_code == 404 and "no queue policy is loaded" in r.json()["detail"]
    assert load(api, BOOST).status_code == 201
    r = api.get("/v1/policies/queue/maps/boost/ml")
    assert r.status_code == 404 and "no key 'ml'" in r.json()["detail"]


def test_a_swap_carries_a_map_with_the_same_spec_and_starts_fresh_with_another(api, daemon):
    assert load(api, BOOST, "boost.py").status_code == 201
    api.put("/v1/policies/queue/maps/boost/vision", json={"value": 2}, headers=AUTH)

    r = load(api, BOOST_V2, "boost_v2.py")
    assert r.status_code == 201
    maps = {m["name"]: m for m in r.json()["maps"]}
    assert (maps["boost"]["entries"], maps["starts"]["entries"]) == (1, 0)
    assert api.get("/v1/policies/queue/maps/boost/vision").json()["value"] == 2
    submit(api, "vision", gpus=1)
    daemon.tick()  # the new version runs: its on_started fills its own map
    assert api.get("/v1/policies/queue/maps/starts").json()["entries"] == [["vision", 1]]

    r = load(api, BOOST_FLOAT, "boost_float.py")
    (boost,) = r.json()["maps"]
    assert (boost["value_type"], boost["entries"]) == ("float", 0)
    assert api.get("/v1/policies/queue/maps/boost").json()["entries"] == []


@pytest.mark.parametrize(
    ("source", "fault"),
    [(RAISES, "exception"), (GARBAGE, "answer")],
    ids=["raises", "returns garbage"],
)
def test_a_faulty_policy_never_stops_scheduling_and_is_detached_after_repeated_faults(
    api, daemon, source, fault
):
    assert load(api, source, "bad.py").status_code == 201
    submit(api, "big")
    started = []
    for i in range(MAX_FAULTS + 2):
        job = submit(api, f"t{i}", priority="high" if i == 2 else "normal")
        daemon.tick()
        started.append(job)
    # Every pass decided by the default: the big job runs, the rest wait in priority-then-FIFO order.
    assert daemon.store.get("1").state.value == "RUNNING"
    assert queue_ids(api)[0] == started[2]
    info = queue_policy(api)
    assert info["detached"] is True and info["name"] == source.split('name = "')[1].split('"')[0]
    (counted,) = info["faults"]  # none counted once detached: the default answers without the policy
    assert (counted["hook"], counted["count"]) == ("order_key", MAX_FAULTS)
    # the guard's words for the two: an exception, and an answer of the wrong shape
    assert (counted["reason"] == "exception") == (fault == "exception")
    events = policy_events(api)
    assert sum("fault" in e for e in events) >= MAX_FAULTS and any("detach" in e for e in events)
    daemon.node.exit("1")
    daemon.tick()
    assert daemon.store.get(started[2]).state.value == "RUNNING"  # detached: the default still decides


def test_swaps_land_between_scheduling_passes_never_inside_one(make_daemon, node):
    """A swapper thread loads two policies (whose keys do not even compare with each other) and unloads
    them over and over while the daemon's loop schedules a stream of jobs: every pass runs with one policy
    from start to end, the mechanism never falls back, and every job starts exactly once."""
    programs = [load_source(BY_TENANT_NAME, "a.py"), load_source(NEWEST_FIRST, "b.py")]
    daemon = make_daemon(tick_seconds=0.002)
    # A queue long enough that each pass makes dozens of guarded hook calls, so a swap that did not wait
    # for the pass to end would land inside one (with the switch interval below, many times a pass); not
    # so long that a loaded machine takes minutes: every hook call is a thread hand-off, at 1e-5 s turns.
    ids = [daemon.submit(JobSpec(command=("x",), gpus=1, tenant=f"t{i % 5}")).id for i in range(80)]
    daemon.start()
    real_step = daemon.scheduler.step
    passes, mixed = [], []

    def step(now: float):
        before = daemon.scheduler.policy
        try:
            return real_step(now)
        finally:
            passes.append(before)
            if daemon.scheduler.policy is not before:
                mixed.append((before, daemon.scheduler.policy))

    daemon.scheduler.step = step
    stop = threading.Event()
    swaps = 0
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns ~500 times as often: a swap inside a pass would show

    def swapper() -> None:
        # one swap after each pass that ran since the last one, 60 in all: every swap arrives while the
        # daemon schedules (with the switch interval below, inside a pass if the daemon let it), and
        # passes always get to run between swaps, so the jobs finish on any machine
        nonlocal swaps
        seen = len(passes)
        while not stop.is_set() and swaps < 60:
            if len(passes) == seen:
                stop.wait(0.0005)
                continue
            seen = len(passes)
            stop.wait(random.uniform(0, 0.002))  # at any point of the next pass, or between passes
            if swaps % 3 == 2:
                daemon.policy_admin.unload_policy("queue")
            else:
                daemon.policy_admin.load_policy(programs[swaps % 3])
            swaps += 1

    def finisher() -> None:
        while not stop.is_set():
            for job_id in list(node.launched):
                if job_id not in node.exits:
                    node.exit(job_id)
            stop.wait(0.001)

    threads = [threading.Thread(target=swapper), threading.Thread(target=finisher)]
    for t in threads:
        t.start()
    try:
        # a liveness bound, not a speed target: policy hooks run on worker threads, slow on a busy machine
        deadline = time.monotonic() + 300
        while swaps < 60 or any(daemon.store.get(i).state is not JobState.SUCCEEDED for i in ids):
            assert time.monotonic() < deadline, (
                f"jobs did not all finish within 300 s: {len(passes)} passes, {swaps} swaps, "
                f"{threading.active_count()} threads in this process; states "
                f"{Counter(daemon.store.get(i).state.value for i in ids)}, {len(node.launched)} launched, "
                f"{len(node.exits)} exited"
            )
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join()
        daemon.stop()
        sys.setswitchinterval(switch)
    assert swaps == 60 and len(set(map(id, passes))) > 1  # passes really ran under different policies
    assert mixed == [] and daemon.scheduler.fallbacks["order_key"] == 0
    starts = Counter(
        e.job_id
        for _, e in daemon.store.events(kind="transition", limit=10_000)
        if e.new_state is JobState.RUNNING
    )
    assert starts == Counter({i: 1 for i in ids})
