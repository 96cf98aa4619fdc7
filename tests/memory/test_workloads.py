"""Generators are deterministic and well-formed; the CSV format round-trips and rejects bad rows."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpuslice.errors import TraceFormatError, UserError
from gpuslice.memory.workloads import WORKLOADS, make_workload, read_trace_csv, write_trace_csv


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_each_workload_is_deterministic_and_in_range(name):
    a, b = make_workload(name, seed=3, scale=0.1), make_workload(name, seed=3, scale=0.1)
    assert len(a) > 0 and np.array_equal(a.block, b.block) and np.array_equal(a.page, b.page)
    assert a.page.min() >= 0 and a.page.max() < 512 and np.all(np.diff(a.time) >= 0)
    assert (a.tenants == 2) == name.startswith("mix-")


def test_csv_round_trip(tmp_path):
    trace = make_workload("mix-gemm", scale=0.1)
    path = tmp_path / "t.csv"
    write_trace_csv(trace, path)
    back = read_trace_csv(path)
    for col in ("tenant", "block", "page", "op", "time", "owner"):
        assert np.array_equal(getattr(trace, col), getattr(back, col)), col


def test_csv_round_trip_keeps_the_stream_column(tmp_path):
    trace = make_workload("rand-stream", scale=0.1)
    path = tmp_path / "s.csv"
    write_trace_csv(trace, path)
    assert path.read_text().splitlines()[0] == "tenant,block,page,op,time,stream"
    assert np.array_equal(read_trace_csv(path).stream, trace.stream)
    assert make_workload("gemm", scale=0.1).stream is None  # lockstep traces write five columns


@pytest.mark.parametrize("name", ["seq-stream", "rand-stream"])
def test_uvmbench_tier0_traces_name_a_thread_per_access_and_a_new_one_per_kernel(name):
    trace = make_workload(name, scale=0.1)  # 64 threads, 2 kernel launches (iterations)
    assert np.unique(trace.stream).size == 128
    first_kernel = trace.stream[: len(trace) // 2]
    assert set(first_kernel.tolist()) == set(range(64))
    # a thread touches one tile: its pages are contiguous and disjoint from every other thread's
    gp = (trace.block.astype(np.int64) * 512 + trace.page)[: len(trace) // 2]
    spans = [(gp[first_kernel == s].min(), gp[first_kernel == s].max()) for s in range(64)]
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))


def test_csv_with_a_bad_row_names_the_row(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("tenant,block,page,op,time\n0,1,2,r,0\n0,1,x,r,1\n")
    with pytest.raises(TraceFormatError, match="row 3"):
        read_trace_csv(path)


@pytest.mark.parametrize(
    "row",
    ["0,1,2,r,inf", "0,1,2,r,1e400", "0,1,2,,5", "0,1,2,rw,5"],
    ids=["time infinite", "time past a float", "op empty", "op two letters"],
)
def test_a_row_with_an_infinite_time_or_an_op_that_is_not_r_w_0_1_names_the_row(tmp_path, row):
    path = tmp_path / "t.csv"
    path.write_text(f"tenant,block,page,op,time\n0,1,1,r,0\n{row}\n")
    with pytest.raises(TraceFormatError, match="row 3"):
        read_trace_csv(path)


def test_a_field_past_the_csv_modules_limit_names_the_row(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("tenant,block,page,op,time\n0,1,1,r,0\n" + "9" * 200_000 + ",1,1,r,1\n")
    with pytest.raises(TraceFormatError, match="row 3: field larger than field limit"):
        read_trace_csv(path)


def test_a_block_shared_by_two_tenants_is_refused(tmp_path):
    path = tmp_path / "shared.csv"
    path.write_text("tenant,block,page,op,time\n0,1,2,0,0\n1,1,3,1,1\n")
    with pytest.raises(TraceFormatError, match="two tenants"):
        read_trace_csv(path)


def test_unknown_workload_lists_the_known_names():
    with pytest.raises(UserError, match="known: seq-stream, rand-stream"):
        make_workload("llm-moe")
