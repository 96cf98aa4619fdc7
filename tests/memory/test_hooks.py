"""The decision context follows gpu_ext v2: first request wins, a conflict cancels, bad values rejected."""

from __future__ import annotations

import pytest

from gpuslice.memory.hooks import BYPASS, HEAD, TAIL, UNUSED, USED, DecisionContext, MemoryOps
from gpuslice.memory.policies import make_ops
from gpuslice.memory.simulator import SimConfig, simulate
from gpuslice.memory.workloads import make_workload


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        ([], ("NOOP_DEFAULT", None)),
        ([(USED, HEAD)], ("APPLY", (USED, HEAD))),
        ([(USED, HEAD), (USED, HEAD)], ("APPLY", (USED, HEAD))),  # identical repeat is a no-op
        ([(USED, HEAD), (UNUSED, TAIL)], ("NOOP_CONFLICT", None)),  # a different second request cancels
        ([(3, HEAD)], ("REJECT_RANGE", None)),
        ([(USED, 0)], ("REJECT_RANGE", None)),
    ],
    ids=["nothing", "one", "repeat", "conflict", "bad-destination", "bad-position"],
)
def test_reorder_request_rules(requests, expected):
    ctx = DecisionContext("reorder")
    for dest, pos in requests:
        ctx.request_reorder(dest, pos)
    assert ctx.commit() == expected


@pytest.mark.parametrize(
    ("region", "code"),
    [
        ((0, 0), "APPLY"),
        ((0, 512), "APPLY"),
        ((5, 5), "REJECT_RANGE"),
        ((10, 513), "REJECT_RANGE"),
        ((-1, 4), "REJECT_RANGE"),
    ],
)
def test_prefetch_region_must_be_inside_the_block(region, code):
    ctx = DecisionContext("region")
    ctx.set_prefetch_region(*region)
    assert ctx.commit()[0] == code


def test_a_request_of_the_wrong_kind_is_rejected_as_an_action():
    ctx = DecisionContext("region")
    ctx.request_reorder(USED, HEAD)
    assert ctx.commit() == ("REJECT_ACTION", None)


class Bogus(MemoryOps):
    """Every request is invalid: out-of-range regions and list codes, conflicts, unknown actions."""

    name = "bogus"

    def block_activate(self, view, block, ctx):
        ctx.request_reorder(USED, HEAD)
        ctx.request_reorder(UNUSED, TAIL)  # conflict

    def block_access(self, view, block, hits, ctx):
        ctx.request_reorder(7, 9)
        return 5

    def evict_prepare(self, view, ctx):
        ctx.move(10**6, USED, HEAD)  # a chunk on no list

    def page_prefetch(self, view, fault, ctx):
        if fault.page_index % 2:
            ctx.set_prefetch_region(100, 900)
            return BYPASS
        return 7


@pytest.mark.parametrize("visibility", ["driver", "full"])
def test_invalid_requests_are_counted_and_ignored(visibility):
    trace = make_workload("hotspot", scale=0.1)
    cfg = SimConfig(oversub=1.5, visibility=visibility)
    bogus = simulate(trace, Bogus(), cfg)
    driver = simulate(trace, make_ops("default", "tree"), cfg)
    # every bad request falls back to the driver's own behaviour, so the run is the driver's run
    assert (bogus.faults, bogus.evictions, bogus.migrated_bytes) == (
        driver.faults,
        driver.evictions,
        driver.migrated_bytes,
    )
    assert bogus.requests["APPLY"] == 0
    assert bogus.requests["NOOP_CONFLICT"] > 0
    assert bogus.requests["REJECT_RANGE"] > 0
    assert bogus.requests["REJECT_ACTION"] > 0
    assert bogus.requests["REJECT_IDENTITY"] > 0
