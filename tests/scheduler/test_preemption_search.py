"""The preemption search's answer is the cheapest fitting victim set, the one an exhaustive search finds.

The search prunes (a subset freeing more GPUs than the best so far is not costed; nodes are searched
below the best node's cost); these checks compare it with every subset costed and tried.
"""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.scheduler.preemption import Victim, find_preemption

NOW = 1000.0

victims = st.lists(
    st.builds(
        lambda i, prio, start, gpus, node: Victim(f"j{i}", prio, start, gpus, node=node),
        st.integers(0, 10**6),
        st.integers(0, 2),
        st.sampled_from([0.0, 100.0, 500.0, 900.0]),
        st.sampled_from([0.25, 0.5, 1.0, 2.0]),
        st.integers(0, 2),
    ),
    max_size=7,
    unique_by=lambda v: v.job_id,
)


def documented_cost(subset: tuple[Victim, ...]) -> tuple[object, ...]:
    """The cost of a victim set as ``scheduler/preemption.py``'s docstring states it, written here on its
    own so that the oracle does not reuse the function it checks: GPUs freed, then the highest priority,
    then the sum of priorities, then GPU-seconds of work lost, then the job ids."""
    freed = sum(v.gpus for v in subset)
    highest = max(v.priority for v in subset)
    total_priority = sum(v.priority for v in subset)
    lost = sum((NOW - v.started_at) * v.gpus for v in subset if v.started_at < NOW)
    return (round(freed, 9), highest, total_priority, round(lost, 6), tuple(sorted(v.job_id for v in subset)))


def exhaustive(running: list[Victim], need: dict[int, float]):
    best = None
    nodes = sorted({v.node for v in running}, key=[v.node for v in running].index)
    for node in nodes:
        on = [v for v in running if v.node == node]
        for size in range(1, len(on) + 1):
            for subset in combinations(on, size):
                if sum(v.gpus for v in subset) >= need[node]:
                    cost = documented_cost(subset)
                    if best is None or cost < best[0]:
                        best = (cost, node)
    return best


@settings(max_examples=300, deadline=None)
@given(victims, st.tuples(*[st.sampled_from([0.5, 1.0, 1.5, 3.0, 9.0])] * 3))
def test_the_search_finds_the_cheapest_set_an_exhaustive_search_finds(running, needs) -> None:
    need = dict(enumerate(needs))  # node -> GPUs that must be freed there for the preemptor to fit
    plan = find_preemption(
        Victim("p", 3, 0.0, 0).ref(), running, lambda node, gone: sum(v.gpus for v in gone) >= need[node], NOW
    )
    expected = exhaustive(running, need)
    if expected is None:
        assert plan is None
    else:
        assert plan is not None
        assert (documented_cost(tuple(plan.victims)), plan.node) == expected


def test_the_highest_priority_in_a_set_counts_before_the_sum_and_the_work_lost() -> None:
    """Node 0 frees two GPUs from priorities 2 and 0 (sum 2, little work lost); node 1 from 1 and 1 (sum 2,
    more work lost). The highest priority in the set comes first: node 1's pair is the cheaper."""
    running = [
        Victim("a", 2, 990.0, 1.0, node=0),
        Victim("b", 0, 990.0, 1.0, node=0),
        Victim("c", 1, 0.0, 1.0, node=1),
        Victim("d", 1, 0.0, 1.0, node=1),
    ]
    plan = find_preemption(Victim("p", 3, 0.0, 0).ref(), running, lambda node, gone: len(gone) >= 2, NOW)
    assert plan is not None and plan.node == 1
    assert sorted(v.job_id for v in plan.victims) == ["c", "d"]
