"""The one preemption search (``scheduler.preemption``) in detail: what the queue policy is shown, the
work lost as a cost, an exact tie between nodes, and the cap on the subsets it visits."""

from __future__ import annotations

from collections import Counter

from gpuslice.policies.queue import JobRef, QueueOps
from gpuslice.policies.queue.base import QueueView
from gpuslice.scheduler import preemption
from gpuslice.scheduler.preemption import Victim, choose_victims, find_preemption, victim_set_cost

HIGH = JobRef("p", 100, "prod", 0.0)


def anywhere(node, gone) -> bool:
    return bool(gone)


class Recording(QueueOps):
    """Allows every victim and keeps what it was asked."""

    name = "recording"

    def __init__(self) -> None:
        self.asked: list[tuple[QueueView, JobRef, JobRef]] = []

    def may_preempt(self, view, preemptor, victim):
        self.asked.append((view, preemptor, victim))
        return True


def test_the_queue_policy_sees_the_preemptor_each_victim_whole_and_the_view_of_now():
    policy = Recording()
    victim = Victim("v", 5, 3.5, 1.0, node="n", tenant="dev")
    assert find_preemption(HIGH, [victim], anywhere, now=10.0, policy=policy) is not None
    assert policy.asked == [(QueueView(10.0), HIGH, JobRef("v", 5, "dev", 3.5))]
    given = QueueView(7.0, aging_seconds=60.0, tenant_gpus={"dev": 1.0})
    find_preemption(HIGH, [victim], anywhere, now=10.0, policy=policy, view=given)
    assert policy.asked[-1][0] is given


def test_without_a_policy_every_victim_is_allowed_and_nothing_counts_as_a_fallback():
    fallbacks: Counter[str] = Counter()
    plan = find_preemption(HIGH, [Victim("v", 5, 0.0, 1.0)], anywhere, now=1.0, fallbacks=fallbacks)
    assert plan is not None and fallbacks == Counter()


def test_work_lost_counts_from_the_start_and_a_job_started_just_now_loses_none():
    assert victim_set_cost([Victim("a", 1, 10.0, 2.0)], now=10.0)[3] == 0.0
    assert victim_set_cost([Victim("a", 1, 12.0, 2.0)], now=10.0)[3] == 0.0  # a clock ahead: never negative
    assert victim_set_cost([Victim("a", 1, 9.6, 2.0)], now=10.0)[3] == 0.8
    # fractions of a GPU-second decide between otherwise equal sets: the newer job goes
    older, newer = Victim("a", 1, 9.6, 1.0), Victim("b", 1, 9.8, 1.0)
    assert choose_victims([older, newer], bool, now=10.0) == (newer,)


def test_on_an_exact_tie_between_nodes_the_node_given_first_wins():
    # the same job id on two nodes (two homes' names for one job): every part of the cost is equal
    running = [Victim("x", 1, 0.0, 1.0, node="a"), Victim("x", 1, 0.0, 1.0, node="b")]
    plan = find_preemption(HIGH, running, anywhere, now=5.0)
    assert plan is not None and plan.node == "a"
    plan = find_preemption(HIGH, running[::-1], anywhere, now=5.0)
    assert plan is not None and plan.node == "b"


def test_the_search_stops_after_max_subsets_keeping_the_best_set_so_far(monkeypatch):
    # four victims, cheapest first; only a set holding "d" makes room, and it is the fourth subset visited
    running = [Victim(name, prio, 0.0, 0.25) for name, prio in (("a", 1), ("b", 2), ("c", 3), ("d", 4))]

    def with_d(gone) -> bool:
        return any(v.job_id == "d" for v in gone)

    monkeypatch.setattr(preemption, "MAX_SUBSETS", 4)
    assert [v.job_id for v in choose_victims(running, with_d, now=1.0)] == ["d"]
    monkeypatch.setattr(preemption, "MAX_SUBSETS", 3)  # "d" alone is never reached: all four stay the answer
    assert [v.job_id for v in choose_victims(running, with_d, now=1.0)] == ["a", "b", "c", "d"]


def test_a_set_too_large_is_passed_over_and_a_later_smaller_set_of_the_same_size_is_still_tried():
    # by GPUs: a 0.1, b 0.4, c 0.5, d 1.0; room needs 0.9 freed. Of the pairs, (a, d) frees more than
    # the best so far (d alone, 1.0), but (b, c), tried after it, frees 0.9 and wins
    running = [Victim(name, 1, 0.0, gpus) for name, gpus in (("a", 0.1), ("b", 0.4), ("c", 0.5), ("d", 1.0))]
    chosen = choose_victims(running, lambda gone: sum(v.gpus for v in gone) >= 0.9 - 1e-9, now=1.0)
    assert [v.job_id for v in chosen] == ["b", "c"]
