"""The replay's kept queue order is ``order_pending``'s, job for job, as jobs enqueue and start."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.policies.queue import QueuedJob, QueueView, order_pending, queue_policy
from gpuslice.sim.pending_order import PendingOrder
from gpuslice.workload.job import JobSpec, Priority

steps = st.lists(
    st.tuples(st.booleans(), st.sampled_from([None, 5.0, 60.0, 600.0]), st.sampled_from(list(Priority))),
    max_size=40,
)


@pytest.mark.parametrize("name", ["fifo", "sjf", "priority-fair"])
@settings(max_examples=60, deadline=None)
@given(steps=steps)
def test_kept_order_is_the_order_pending_sort(name: str, steps) -> None:
    policy = queue_policy(name)()
    pending = PendingOrder(policy, Counter())
    assert pending.kept == (name != "priority-fair")
    jobs: dict[int, QueuedJob] = {}
    for seq, (add, runtime, priority) in enumerate(steps):
        view = QueueView(float(seq * 100), tenant_gpus={"a": seq % 3})
        if add or not jobs:
            spec = JobSpec(
                command=("x",), priority=priority, tenant="ab"[seq % 2], max_runtime_seconds=runtime
            )
            jobs[seq] = QueuedJob(str(seq), spec, float(seq * 100), seq)
            pending.add(seq, jobs[seq], view)
        else:
            gone = sorted(jobs)[(seq * 7) % len(jobs)]
            del jobs[gone]
            pending.remove(gone)
        expected = order_pending(policy, view, list(jobs.values()))
        ordered = pending.ordered(view)
        assert list(ordered) == expected
        # the replay reads the order by index and by slice (the jobs after a start)
        assert [ordered[i] for i in range(len(ordered))] == expected
        assert list(ordered[seq % 3 :]) == expected[seq % 3 :]
