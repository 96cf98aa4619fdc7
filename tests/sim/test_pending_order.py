"""The replay's walk of its pending queue is ``order_pending``'s order, job for job, as jobs enqueue and
start and a start changes the tenants' usage (kept, merged and sorted queues alike)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.policies.queue import QueuedJob, QueueView, order_pending, queue_policy
from gpuslice.policies.queue.priority_fair import PriorityFair
from gpuslice.sim.pending_order import PendingOrder
from gpuslice.workload.job import JobSpec, Priority

steps = st.lists(
    st.tuples(
        st.booleans(),
        st.sampled_from([None, 5.0, 60.0, 600.0]),
        st.sampled_from(list(Priority)),
        st.sampled_from("abc"),
        st.integers(0, 3),
    ),
    max_size=40,
)


class Resorted(PriorityFair):
    """Priority-fair's key with the tenant's usage turned around: no promise about submission order."""

    def order_key(self, view, job):  # type: ignore[no-untyped-def]
        return (-self.priority(view, job), -view.usage(job.spec.tenant))


def _policy(name: str):  # type: ignore[no-untyped-def]
    return Resorted() if name == "resorted" else queue_policy(name)()


@pytest.mark.parametrize("name", ["fifo", "sjf", "priority-fair", "resorted"])
@settings(max_examples=60, deadline=None)
@given(steps=steps)
def test_walk_is_the_order_pending_sort_after_each_start(name: str, steps) -> None:
    policy = _policy(name)
    pending = PendingOrder(policy, Counter())
    modes = {"fifo": (True, False), "sjf": (True, False), "priority-fair": (False, True)}
    assert (pending.kept, pending.merged) == modes.get(name, (False, False))
    jobs: dict[int, QueuedJob] = {}
    usage = {"a": 0.0, "b": 2.0, "c": 1.0}
    for seq, (add, runtime, priority, tenant, starts) in enumerate(steps):
        now = float(seq * 250)
        view = QueueView(now, tenant_gpus=usage)
        if add or not jobs:
            spec = JobSpec(command=("x",), priority=priority, tenant=tenant, max_runtime_seconds=runtime)
            jobs[seq] = QueuedJob(str(seq), spec, now, seq)
            pending.add(seq, jobs[seq], view)
        else:
            gone = sorted(jobs)[(seq * 7) % len(jobs)]
            del jobs[gone]
            pending.remove(gone)
        # one pass: every `starts`-th job walked starts, which moves its tenant's usage
        walk = pending.walk(view)
        left = dict(jobs)
        expected = order_pending(policy, view, list(left.values()))
        for walked, job in enumerate(walk, start=1):
            assert job == expected[0]
            assert walk.after(expected[1:][::-1]) == expected[1:]  # the rest, in the walk's order now
            del left[int(job.job_id)]
            if starts and walked % starts == 0:
                pending.remove(int(job.job_id))
                del jobs[int(job.job_id)]
                usage[job.spec.tenant] += 1.5
                walk.started()
            expected = order_pending(policy, view, list(left.values()))
        assert not left


def test_merged_queue_refuses_jobs_out_of_submission_order() -> None:
    pending = PendingOrder(queue_policy("priority-fair")(), Counter())
    spec = JobSpec(command=("x",), tenant="a")
    pending.add(0, QueuedJob("0", spec, 10.0, 5), QueueView(10.0))
    with pytest.raises(ValueError, match="submission order"):
        pending.add(1, QueuedJob("1", spec, 9.0, 6), QueueView(10.0))


def test_merged_walk_reads_the_heads_again_after_a_start_moves_a_tenants_usage() -> None:
    # a's two jobs lead c's while a uses less; once a's first job starts and a uses more than c, c's job
    # comes before a's second (a head key read before the start would keep a's second first)
    policy = queue_policy("priority-fair")()
    pending = PendingOrder(policy, Counter())
    usage = {"a": 0.0, "c": 1.0}
    view = QueueView(0.0, tenant_gpus=usage)
    for seq, tenant in enumerate("aac"):
        pending.add(seq, QueuedJob(str(seq), JobSpec(command=("x",), tenant=tenant), 0.0, seq), view)
    walk = pending.walk(view)
    first = next(walk)
    assert first.job_id == "0"
    pending.remove(0)
    usage["a"] += 1.5
    walk.started()
    assert [j.job_id for j in walk] == ["2", "1"]
