"""GET /metrics over a daemon with the fake node: no token needed, the exposition format, and the
daemon's events (starts, preemptions, failures, enforcement) counted where they happen."""

from __future__ import annotations

import signal
import warnings

from prometheus_client.parser import text_string_to_metric_families

from gpuslice.server.app import create_app
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, JobState, Priority

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient


def spec(**kw) -> JobSpec:
    return JobSpec(command=("train",), **kw)


def scrape(daemon) -> dict[tuple[str, frozenset], float]:
    with TestClient(create_app(daemon, "tok")) as client:
        r = client.get("/metrics")  # no Authorization header: read-only
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_starts_failures_and_the_queue_are_counted(daemon, node, clock):
    ok = daemon.submit(spec(gpus=8, tenant="ml", priority=Priority.HIGH))
    waiting = daemon.submit(spec(gpu_memory_bytes=10 * GiB, tenant="cv"))
    clock.now += 2.0
    daemon.tick()
    clock.now += 3.0
    daemon.tick()
    s = scrape(daemon)
    assert s[("gpuslice_scheduler_decisions_total", frozenset({("decision", "start")}))] == 1
    latency = frozenset({("priority", "high"), ("le", "2.5")})
    assert s[("gpuslice_scheduling_latency_seconds_bucket", latency)] == 1  # waited 2 s before its start
    assert s[("gpuslice_pending_jobs", frozenset({("tenant", "cv"), ("priority", "normal")}))] == 1
    assert s[("gpuslice_pending_longest_wait_seconds", frozenset({("tenant", "cv")}))] == 5.0
    assert s[("gpuslice_scheduling_failures_total", frozenset({("reason", "insufficient_gpu")}))] == 1
    assert s[("gpuslice_jobs", frozenset({("state", "RUNNING")}))] == 1
    slice_labels = frozenset(
        {("job_id", ok.id), ("tenant", "ml"), ("pod", ""), ("namespace", ""), ("gpu", "3")}
    )
    assert s[("gpuslice_slice_memory_allocated_bytes", slice_labels)] == 80 * GiB
    assert s[("gpuslice_slice_compute_allocated_ratio", slice_labels)] == 1.0
    node.exit(ok.id, 3)
    daemon.tick()
    daemon.tick()
    s = scrape(daemon)
    assert s[("gpuslice_job_failures_total", frozenset({("reason", "exit_code")}))] == 1
    assert s[("gpuslice_scheduler_decisions_total", frozenset({("decision", "start")}))] == 2
    assert ("gpuslice_pending_jobs", frozenset({("tenant", "cv"), ("priority", "normal")})) not in s
    assert waiting.id in daemon.scheduler.running()


def test_preemptions_and_enforcement_actions_are_counted(daemon, node):
    low = daemon.submit(spec(gpus=8, priority=Priority.LOW, tenant="batch"))
    daemon.tick()
    daemon.submit(spec(gpus=1, priority=Priority.REALTIME))
    daemon.tick()
    node.exit(low.id, 128 + signal.SIGTERM, signal.SIGTERM)
    daemon.tick()
    share = daemon.submit(spec(gpu_memory_bytes=20 * GiB, tenant="ml"))
    daemon.tick()
    node.used[share.id] = {0: 30 * GiB}
    for action in ("warn", "suspend"):
        node.decisions[share.id] = (action, f"over its slice: {action}")
        daemon.tick()
    s = scrape(daemon)
    assert s[("gpuslice_scheduler_decisions_total", frozenset({("decision", "preempt")}))] == 1
    assert s[("gpuslice_preemptions_total", frozenset({("tenant", "batch"), ("priority", "low")}))] == 1
    for action in ("warn", "suspend"):
        labels = frozenset({("action", action), ("tenant", "ml")})
        assert s[("gpuslice_enforcement_actions_total", labels)] == 1


def test_the_queue_figures_come_from_one_grouped_store_read(daemon):
    store = daemon.store
    a = store.add_job(spec(tenant="ml"), 100.0)
    store.add_job(spec(tenant="ml"), 105.0)
    store.add_job(spec(tenant="cv", priority=Priority.HIGH), 103.0)
    # a requeued job waits from the end of its previous attempt, not from its submit
    store.transition(a.id, JobState.RUNNING, "started", 110.0, attempts=1, started_at=110.0)
    store.transition(a.id, JobState.FAILED, "failed with exit code 1", 120.0, finished_at=120.0)
    store.transition(a.id, JobState.PENDING, "restart 1 of 3 (on-failure)", 120.0)
    groups = sorted(store.pending_groups())
    assert groups == [("cv", int(Priority.HIGH), 1, 103.0), ("ml", int(Priority.NORMAL), 2, 105.0)]
    counts = store.counts()
    assert counts[JobState.PENDING] == 3 and counts[JobState.SUCCEEDED] == 0 and len(counts) == len(JobState)


def test_each_way_a_job_fails_is_counted_under_the_code_the_daemon_gave_it(daemon, node, clock):
    launch = daemon.submit(JobSpec(command=("nope",), gpus=1))
    node.fail_launch.add(launch.id)
    limited = daemon.submit(JobSpec(command=("train",), gpus=1, max_runtime_seconds=5))
    crashed = daemon.submit(JobSpec(command=("train",), gpus=1))
    daemon.tick()
    node.exit(crashed.id, 1)
    clock.now += 10  # past the 5 s limit: the daemon stops the limited job
    daemon.tick()
    node.exit(limited.id, 0, signal=15)
    daemon.tick()
    failed = {j.id: j.reason for j in daemon.store.jobs() if j.state is JobState.FAILED}
    assert set(failed) == {launch.id, limited.id, crashed.id}, failed
    s = scrape(daemon)
    for code in ("launch", "max_runtime", "exit_code"):
        assert s[("gpuslice_job_failures_total", frozenset({("reason", code)}))] == 1, code
