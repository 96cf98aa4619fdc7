"""The daemon loop over a fake node: starts, exits, restarts, preemption, cancel, limits, enforcement,
and recovery after the server died (``kill -9``) with jobs running, finished, lost and half-launched."""

from __future__ import annotations

import signal

import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.node.launcher import LaunchedJob
from gpuslice.server.errors import JobConflict
from gpuslice.server.store import TenantRecord
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, JobState, Priority, RestartPolicy


def spec(**kw) -> JobSpec:
    return JobSpec(command=("train",), **kw)


def states(daemon) -> dict[str, JobState]:
    return {j.id: j.state for j in daemon.store.jobs()}


def test_submitted_job_starts_on_the_next_tick_and_succeeds_at_exit_0(daemon, node):
    job = daemon.submit(spec(gpus=2))
    daemon.tick()
    running = daemon.store.get(job.id)
    assert running.state is JobState.RUNNING and len(running.gpus) == 2
    assert running.pid == node.launched[job.id].pid and running.attempts == 1
    assert node.envs[job.id]["CUDA_VISIBLE_DEVICES"].count("GPU-") == 2
    node.exit(job.id, 0)
    daemon.tick()
    done = daemon.store.get(job.id)
    assert (done.state, done.exit_code, done.reason) == (JobState.SUCCEEDED, 0, "exited 0")


def test_a_job_that_can_never_run_is_refused_and_not_stored(daemon):
    with pytest.raises(InvalidRequest):
        daemon.submit(spec(gpu_memory_bytes=200 * GiB))
    assert daemon.store.jobs() == []


def test_failure_with_on_failure_restart_requeues_until_max_restarts(daemon, node):
    job = daemon.submit(spec(restart=RestartPolicy.ON_FAILURE, max_restarts=1))
    daemon.tick()
    node.exit(job.id, 3)
    daemon.tick()  # FAILED -> PENDING -> started again in the same tick
    again = daemon.store.get(job.id)
    assert (again.state, again.attempts) == (JobState.RUNNING, 2)
    node.exit(job.id, 3)
    daemon.tick()
    final = daemon.store.get(job.id)
    assert (final.state, final.exit_code, final.reason) == (JobState.FAILED, 3, "failed with exit code 3")
    moves = [(e.old_state, e.new_state) for _, e in daemon.store.events(job.id) if e.new_state]
    assert moves.count((JobState.FAILED, JobState.PENDING)) == 1


def test_realtime_job_preempts_a_low_one_which_goes_back_to_the_queue(daemon, node):
    low = daemon.submit(spec(gpus=8, priority=Priority.LOW))
    daemon.tick()
    rt = daemon.submit(spec(gpus=1, priority=Priority.REALTIME))
    daemon.tick()
    assert ("term", node.launched[low.id].pgid) in node.signals
    assert daemon.store.get(low.id).stop == "preempt"
    assert daemon.store.get(rt.id).state is JobState.PENDING
    node.exit(low.id, 128 + signal.SIGTERM, signal.SIGTERM)
    daemon.tick()
    assert states(daemon) == {low.id: JobState.PENDING, rt.id: JobState.RUNNING}
    moves = [(e.old_state, e.new_state) for _, e in daemon.store.events(low.id) if e.new_state]
    assert moves[-2:] == [(JobState.RUNNING, JobState.PREEMPTED), (JobState.PREEMPTED, JobState.PENDING)]


def test_cancel_pending_is_immediate_running_waits_for_exit_finished_is_a_conflict(daemon, node):
    a = daemon.submit(spec(gpus=8))
    b = daemon.submit(spec(gpus=8))
    daemon.tick()
    assert daemon.cancel(b.id).state is JobState.CANCELLED
    assert daemon.cancel(a.id).stop == "cancel" and ("term", node.launched[a.id].pgid) in node.signals
    node.exit(a.id, 143, 15)
    daemon.tick()
    assert daemon.store.get(a.id).state is JobState.CANCELLED
    with pytest.raises(JobConflict, match="only pending or running"):
        daemon.cancel(a.id)


def test_max_runtime_stops_the_job_and_it_fails_without_restart(daemon, node, clock):
    job = daemon.submit(spec(max_runtime_seconds=60, restart=RestartPolicy.ALWAYS))
    daemon.tick()
    clock.now += 61
    daemon.tick()
    assert daemon.store.get(job.id).stop == "limit"
    node.exit(job.id, 143, 15)
    daemon.tick()
    done = daemon.store.get(job.id)
    assert done.state is JobState.FAILED and "max runtime of 60 s" in done.reason


def test_a_group_that_outlives_its_grace_is_killed(daemon, node, clock):
    job = daemon.submit(spec(gpus=8))
    daemon.tick()
    daemon.cancel(job.id)
    clock.now += 2 + 5 + 1  # grace 2 s + slack
    daemon.tick()
    assert ("kill", node.launched[job.id].pgid) in node.signals


def test_graded_response_warns_suspends_then_kills_each_as_an_event(daemon, node):
    job = daemon.submit(spec(gpu_memory_bytes=20 * GiB))
    daemon.tick()
    pgid = node.launched[job.id].pgid
    node.used[job.id] = {0: 30 * GiB}
    for action in ("warn", "suspend", "kill"):
        node.decisions[job.id] = (action, f"uses 30 GiB of its 20 GiB slice: {action}")
        daemon.tick()
    assert [s for s in node.signals if s[1] == pgid] == [("stop", pgid), ("kill", pgid)]
    node.exit(job.id, 137, 9)
    daemon.tick()
    done = daemon.store.get(job.id)
    assert done.state is JobState.FAILED and "exceeding its GPU memory slice" in done.reason
    kinds = [e.detail.get("action") for _, e in daemon.store.events(job.id) if e.kind == "enforcement"]
    assert kinds == ["warn", "suspend", "kill"]


def test_external_memory_is_handed_to_the_scheduler(daemon, node):
    node.external = {3: 70 * GiB}
    daemon.tick()
    assert daemon.views.gpus()[3]["external_memory_bytes"] == 70 * GiB


def test_tenant_quota_holds_jobs_back_with_a_reason(daemon):
    daemon.set_tenant(TenantRecord("vision", max_gpus=2))
    jobs = [daemon.submit(spec(gpus=1, tenant="vision")) for _ in range(3)]
    daemon.tick()
    assert [daemon.store.get(j.id).state for j in jobs].count(JobState.RUNNING) == 2
    (_, reason), *_ = daemon.queue()
    assert "quota" in reason


def test_launch_failure_fails_the_job_and_frees_its_gpus(daemon, node):
    node.fail_launch.add("1")
    bad = daemon.submit(spec(gpus=8))
    daemon.tick()
    assert daemon.store.get(bad.id).state is JobState.FAILED
    ok = daemon.submit(spec(gpus=8))
    daemon.tick()
    assert daemon.store.get(ok.id).state is JobState.RUNNING


def test_recovery_adopts_live_reads_exits_marks_lost_and_requeues(make_daemon, node):
    first = make_daemon()
    live = first.submit(spec(gpus=2))
    done = first.submit(spec(gpus=2))
    lost = first.submit(spec(gpus=2, restart=RestartPolicy.ON_FAILURE))
    gone = first.submit(spec(gpus=2))
    waiting = first.submit(spec(gpus=8))
    first.tick()
    # The server dies (no stop, no cleanup); meanwhile one job ends and two supervisors vanish.
    node.exit(done.id, 0)
    node.alive.discard(node.launched[lost.id].pid)
    node.alive.discard(node.launched[gone.id].pid)
    second = make_daemon()
    report = second.recover()
    assert sorted(report.adopted) == sorted([live.id, done.id])
    assert sorted(report.lost) == sorted([lost.id, gone.id]) and report.requeued == [lost.id]
    second.tick()
    got = {j.id: (j.state, j.exit_code) for j in second.store.jobs()}
    assert got[live.id] == (JobState.RUNNING, None)
    assert got[done.id] == (JobState.SUCCEEDED, 0)
    assert got[gone.id][0] is JobState.FAILED
    assert "lost while the server was down" in second.store.get(gone.id).reason
    assert got[lost.id][0] is JobState.RUNNING  # requeued and started again
    assert got[waiting.id][0] is JobState.PENDING  # 8 GPUs wait behind the live job
    assert len(second.store.jobs()) == 5


def test_recovery_finds_a_supervisor_started_just_before_the_crash(make_daemon, node, clock):
    first = make_daemon()
    job = first.submit(spec())
    # As if the server died between storing RUNNING and storing the pid.
    first.store.transition(job.id, JobState.RUNNING, "started on GPU 0", clock.now, gpus=(0,), attempts=1)
    node.found[job.id] = LaunchedJob(4242, 4242, 1.0)
    node.alive.add(4242)
    second = make_daemon()
    assert second.recover().adopted == [job.id]
    assert second.store.get(job.id).pid == 4242
