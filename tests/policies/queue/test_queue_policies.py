"""Queue policies: the registry, each policy's order, and the mechanism's guard against bad answers."""

from __future__ import annotations

from collections import Counter

import pytest

from gpuslice.errors import UnknownPolicy
from gpuslice.policies.queue import (
    QUEUE,
    Fifo,
    PriorityFair,
    QueuedJob,
    QueueOps,
    QueueView,
    effective_priority,
    order_pending,
    queue_policy,
)
from gpuslice.workload.job import JobSpec, Priority


def job(job_id: str, seq: int, priority: Priority = Priority.NORMAL, tenant: str = "t", at: float = 0.0):
    return QueuedJob(job_id, JobSpec(("true",), priority=priority, tenant=tenant), at, seq)


def ids(jobs):
    return [j.job_id for j in jobs]


def test_registry_names_every_policy_and_unknown_names_list_them():
    assert set(QUEUE) == {"fifo", "priority-fair", "sjf"}
    assert queue_policy("fifo") is Fifo
    with pytest.raises(UnknownPolicy, match="known: fifo, priority-fair"):
        queue_policy("fair")


@pytest.mark.parametrize(
    ("name", "policy", "jobs", "view", "expected"),
    [
        (
            "fifo ignores priority",
            Fifo(),
            [job("a", 0, Priority.LOW), job("b", 1, Priority.REALTIME)],
            QueueView(now=0),
            ["a", "b"],
        ),
        (
            "default policy: strict priority first",
            QueueOps(),
            [job("a", 0, Priority.LOW), job("b", 1, Priority.HIGH), job("c", 2)],
            QueueView(now=0),
            ["b", "c", "a"],
        ),
        (
            "priority-fair: FIFO inside a level",
            PriorityFair(),
            [job("a", 0), job("b", 1), job("c", 2)],
            QueueView(now=0),
            ["a", "b", "c"],
        ),
        (
            "priority-fair: tenant below its share goes first",
            PriorityFair(),
            [job("a", 0, tenant="busy"), job("b", 1, tenant="idle")],
            QueueView(now=0, tenant_gpus={"busy": 2.0}),
            ["b", "a"],
        ),
        (
            "priority-fair: weight divides usage",
            PriorityFair(),
            [job("a", 0, tenant="heavy"), job("b", 1, tenant="light")],
            QueueView(now=0, tenant_gpus={"heavy": 4.0, "light": 1.0}, tenant_weight={"heavy": 8.0}),
            ["a", "b"],
        ),
        (
            "priority-fair: priority beats fair share",
            PriorityFair(),
            [job("a", 0, tenant="idle"), job("b", 1, Priority.HIGH, tenant="busy")],
            QueueView(now=0, tenant_gpus={"busy": 8.0}),
            ["b", "a"],
        ),
        (
            "priority-fair: a starving LOW job ages past a new NORMAL one",
            PriorityFair(),
            [job("new", 1, at=1000.0), job("old", 0, Priority.LOW, at=0.0)],
            QueueView(now=1300.0, aging_seconds=600.0),
            ["old", "new"],
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_policy_orders_jobs(name, policy, jobs, view, expected):
    assert ids(order_pending(policy, view, jobs)) == expected


@pytest.mark.parametrize(
    ("own", "waited", "expected"),
    [
        (Priority.IDLE, 0, Priority.IDLE),
        (Priority.IDLE, 599, Priority.IDLE),
        (Priority.IDLE, 600, Priority.LOW),
        (Priority.LOW, 1200, Priority.HIGH),
        (Priority.LOW, 100_000, Priority.HIGH),  # never above HIGH
        (Priority.REALTIME, 100_000, Priority.REALTIME),
    ],
)
def test_aging_gains_one_level_per_period_up_to_high(own, waited, expected):
    view = QueueView(now=float(waited), aging_seconds=600.0)
    assert PriorityFair().priority(view, job("a", 0, own)) == expected


class Broken(QueueOps):
    name = "broken"

    def priority(self, view, job):
        raise RuntimeError("bug")

    def order_key(self, view, job):
        return (object(),)  # keys that do not compare


class TooHigh(QueueOps):
    name = "too-high"

    def priority(self, view, job):
        return int(Priority.REALTIME)


def test_a_policy_that_raises_or_gives_bad_keys_falls_back_to_the_default_and_is_counted():
    fallbacks: Counter[str] = Counter()
    jobs = [job("a", 0, Priority.LOW), job("b", 1, Priority.HIGH), job("c", 2, Priority.LOW)]
    assert ids(order_pending(Broken(), QueueView(now=0), jobs, fallbacks)) == ["b", "a", "c"]
    assert effective_priority(Broken(), QueueView(now=0), jobs[0], fallbacks) == Priority.LOW
    assert fallbacks == Counter({"order_key": 1, "priority": 1})


def test_a_policy_cannot_raise_a_job_above_high_by_aging():
    fallbacks: Counter[str] = Counter()
    assert (
        effective_priority(TooHigh(), QueueView(now=0), job("a", 0, Priority.LOW), fallbacks) == Priority.LOW
    )
    assert fallbacks["priority"] == 1


def test_the_policy_with_only_a_name_orders_by_priority_then_fifo():
    class OnlyName(QueueOps):
        name = "only-name"

    jobs = [job("a", 0), job("b", 1, Priority.HIGH), job("c", 2)]
    assert ids(order_pending(OnlyName(), QueueView(now=0), jobs)) == ["b", "a", "c"]
